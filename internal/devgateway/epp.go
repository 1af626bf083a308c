// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Wire names shared with the picker (site-src/protocols.md, "Picker to gateway").
const (
	HeaderDestination       = "x-gateway-destination-endpoint"
	MetadataNamespaceLB     = "envoy.lb"
	MetadataKeyServed       = "x-gateway-destination-endpoint-served"
	headerRequestID         = "x-request-id"
	headerContentLength     = "content-length"
	grpcMaxRecvMessageBytes = 128 << 20
)

// eppConns keeps one gRPC connection per (picker address, :authority), as
// Envoy keeps one cluster per EPP Service: the authority is a property of
// the connection (per-call overrides are refused over TLS by grpc-go, since
// they would have to match the picker's certificate).
type eppConns struct {
	plaintext bool
	mu        sync.Mutex
	closed    bool
	conns     map[[2]string]*grpc.ClientConn
}

func (c *eppConns) get(addr, authority string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("gateway stopping")
	}
	key := [2]string{addr, authority}
	if cc, ok := c.conns[key]; ok {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if !c.plaintext {
		// Gateways do not verify the EPP's (usually self-signed) certificate.
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})
	}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithAuthority(authority),
		// Reconnect quickly after a picker restart: the default backoff
		// grows to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcMaxRecvMessageBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("ext_proc client for %s (authority %s): %w", addr, authority, err)
	}
	if c.conns == nil {
		c.conns = map[[2]string]*grpc.ClientConn{}
	}
	c.conns[key] = cc
	return cc, nil
}

func (c *eppConns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	c.conns = nil
}

// decision is the outcome of a stream's request phase.
type decision struct {
	// immediate, when set, is the picker's direct answer to the client.
	immediate *extprocv3.ImmediateResponse
	// headers are the request headers after the picker's mutations.
	headers http.Header
	// path is the request path after a :path mutation ("" when unchanged).
	path string
	// body is the request body as the picker streamed it back.
	body []byte
	// endpoints are the destinations in order (primary, then fallbacks).
	endpoints []string
	// mismatch is set when the header and envoy.lb metadata disagreed.
	mismatch string
}

// exchange is one ext_proc stream for one HTTP request.
type exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	// recvErr holds the first receive error of the response phase.
	responses chan *extprocv3.ProcessingResponse
	recvDone  chan struct{}
	recvErr   error
}

// retryable reports whether a failed request phase may be tried again: the
// picker was unreachable or went away before deciding.
func retryable(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled, codes.DeadlineExceeded:
		// A stream cut by a dying server surfaces as Canceled on some paths.
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	return false
}

// requestHeaderMap is what Envoy sends as request headers: pseudo-headers,
// then the request's headers lower-cased, values in RawValue.
func requestHeaderMap(r *http.Request, h http.Header, path string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	add := func(k, v string) {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	add(":method", r.Method)
	add(":path", path)
	add(":authority", r.Host)
	add(":scheme", "http")
	for k, vs := range h {
		for _, v := range vs {
			add(strings.ToLower(k), v)
		}
	}
	return hm
}

// open starts a stream and runs its request phase: headers, then the body
// in chunks, collecting the picker's mutations until it has answered the
// headers and streamed the whole body back (or answered immediately).
func (g *Gateway) open(ctx context.Context, client extprocv3.ExternalProcessorClient, r *http.Request, headers http.Header, path string, body []byte) (*exchange, *decision, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := client.Process(sctx, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	ex := &exchange{stream: stream, cancel: cancel, responses: make(chan *extprocv3.ProcessingResponse, 16), recvDone: make(chan struct{})}
	go ex.receive()

	hasBody := len(body) > 0
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- g.sendRequest(stream, r, headers, path, body)
	}()

	d := &decision{headers: headers.Clone()}
	var lbMeta string
	headersAnswered, bodyDone := false, !hasBody
	var bodyBuf []byte
	for !headersAnswered || !bodyDone {
		resp, ok := <-ex.responses
		if !ok {
			ex.close()
			<-sendErr
			if ex.recvErr == nil {
				return nil, nil, io.ErrUnexpectedEOF
			}
			return nil, nil, ex.recvErr
		}
		if m := lbDestination(resp.GetDynamicMetadata()); m != "" {
			lbMeta = m
		}
		switch rr := resp.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			// The stream is over: the picker answered the client itself.
			ex.close()
			<-sendErr
			d.immediate = rr.ImmediateResponse
			return nil, d, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			headersAnswered = true
			d.apply(rr.RequestHeaders.GetResponse())
		case *extprocv3.ProcessingResponse_RequestBody:
			common := rr.RequestBody.GetResponse()
			d.apply(common)
			switch m := common.GetBodyMutation().GetMutation().(type) {
			case *extprocv3.BodyMutation_StreamedResponse:
				bodyBuf = append(bodyBuf, m.StreamedResponse.GetBody()...)
				if m.StreamedResponse.GetEndOfStream() {
					bodyDone = true
				}
			case *extprocv3.BodyMutation_Body:
				bodyBuf, bodyDone = m.Body, true
			case *extprocv3.BodyMutation_ClearBody:
				bodyBuf, bodyDone = nil, true
			default:
				// A BUFFERED-style answer without mutation keeps the body.
				bodyBuf, bodyDone = body, true
			}
		case *extprocv3.ProcessingResponse_RequestTrailers:
			d.apply(&extprocv3.CommonResponse{HeaderMutation: rr.RequestTrailers.GetHeaderMutation()})
		default:
			ex.close()
			<-sendErr
			return nil, nil, status.Errorf(codes.Internal, "ext_proc: unexpected %T during the request phase", rr)
		}
	}
	if err := <-sendErr; err != nil && !errors.Is(err, io.EOF) {
		ex.close()
		return nil, nil, err
	}
	if hasBody {
		d.body = bodyBuf
	}
	hdr := d.headers.Get(HeaderDestination)
	switch {
	case hdr != "" && lbMeta != "" && hdr != lbMeta:
		d.mismatch = fmt.Sprintf("header %s=%q but metadata %s=%q", HeaderDestination, hdr, MetadataNamespaceLB, lbMeta)
	case hdr == "":
		hdr = lbMeta
	}
	for _, ep := range strings.Split(hdr, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			d.endpoints = append(d.endpoints, ep)
		}
	}
	return ex, d, nil
}

func (g *Gateway) sendRequest(stream extprocv3.ExternalProcessor_ProcessClient, r *http.Request, headers http.Header, path string, body []byte) error {
	err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     requestHeaderMap(r, headers, path),
			EndOfStream: len(body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	})
	if err != nil {
		return err
	}
	for off := 0; off < len(body); off += g.opts.BodyChunkBytes {
		end := min(off+g.opts.BodyChunkBytes, len(body))
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)},
		}}); err != nil {
			return err
		}
	}
	return nil
}

// receive moves the stream's responses to the channel until it ends.
func (ex *exchange) receive() {
	defer close(ex.responses)
	defer close(ex.recvDone)
	for {
		resp, err := ex.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				ex.recvErr = err
			}
			return
		}
		ex.responses <- resp
	}
}

// close ends the stream and waits for its receiver.
func (ex *exchange) close() {
	ex.cancel()
	for range ex.responses {
	}
	<-ex.recvDone
}

// apply applies a CommonResponse's header mutation to the decision.
func (d *decision) apply(c *extprocv3.CommonResponse) {
	if c == nil {
		return
	}
	if p := applyHeaderMutation(d.headers, c.GetHeaderMutation()); p != "" {
		d.path = p
	}
}

// applyHeaderMutation sets and removes headers as Envoy does; it returns a
// new :path when the mutation sets one. Other pseudo-headers are ignored.
func applyHeaderMutation(h http.Header, m *extprocv3.HeaderMutation) (path string) {
	if m == nil {
		return ""
	}
	for _, name := range m.GetRemoveHeaders() {
		if !strings.HasPrefix(name, ":") {
			h.Del(name)
		}
	}
	for _, o := range m.GetSetHeaders() {
		k := o.GetHeader().GetKey()
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		if k == ":path" {
			path = v
			continue
		}
		if strings.HasPrefix(k, ":") {
			continue
		}
		appendValue := o.GetAppendAction() == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		// The deprecated field wins when set, as in Envoy.
		legacyAppend := o.GetAppend() //nolint:staticcheck // SA1019: read because Envoy still honours it
		if legacyAppend != nil {
			appendValue = legacyAppend.GetValue()
		}
		switch {
		case o.GetAppendAction() == corev3.HeaderValueOption_ADD_IF_ABSENT && legacyAppend == nil:
			if h.Get(k) == "" {
				h.Set(k, v)
			}
		case o.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS && legacyAppend == nil:
			if h.Get(k) != "" {
				h.Set(k, v)
			}
		case appendValue:
			h.Add(k, v)
		default:
			h.Set(k, v)
		}
	}
	return path
}

func lbDestination(s *structpb.Struct) string {
	ns := s.GetFields()[MetadataNamespaceLB].GetStructValue()
	return ns.GetFields()[HeaderDestination].GetStringValue()
}

// servedMetadata is the metadata_context Envoy sends on the response path:
// the endpoint that actually served the request.
func servedMetadata(endpoint string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespaceLB: {Fields: map[string]*structpb.Value{MetadataKeyServed: structpb.NewStringValue(endpoint)}},
	}}
}
