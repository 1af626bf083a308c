// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package eppclient plays a gateway's side of Envoy's ext_proc protocol
// against an endpoint picker, in the stream shapes real gateways use, and
// reports what the picker answered.
package eppclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Wire names of the Inference Extension's EPP protocol.
const (
	HeaderDestination      = "x-gateway-destination-endpoint"
	MetadataNamespaceLB    = "envoy.lb"
	MetadataKeyServed      = "x-gateway-destination-endpoint-served"
	MetadataNamespaceHint  = "envoy.lb.subset_hint"
	MetadataKeySubset      = "x-gateway-destination-endpoint-subset"
	HeaderTestSelection    = "test-epp-endpoint-selection"
	HeaderTestServedResult = "x-conformance-test-served-endpoint"
	MetadataKeyPoolTag     = "x-gateway-inference-pool"
)

// Shape is how a gateway drives one ext_proc stream.
type Shape int

const (
	// FullDuplex is Envoy's FULL_DUPLEX_STREAMED request and response
	// bodies (Istio, kgateway, Envoy AI Gateway, agentgateway): headers, then
	// the body in chunks, each answered with a streamed body mutation.
	FullDuplex Shape = iota
	// Buffered is Envoy's BUFFERED request body: the gateway waits for the
	// headers' answer before it sends the whole body in one message.
	Buffered
	// NGF is NGINX Gateway Fabric's shim: header values in Value, no
	// pseudo-headers, x-epp-host and x-epp-port, the whole body in one
	// message, then the gateway closes its side; no response phase.
	NGF
)

func (s Shape) String() string {
	switch s {
	case FullDuplex:
		return "FULL_DUPLEX_STREAMED"
	case Buffered:
		return "BUFFERED"
	case NGF:
		return "NGF"
	}
	return fmt.Sprintf("Shape(%d)", int(s))
}

// Options configure a Client. The zero value is a plaintext client.
type Options struct {
	// TLS dials the picker over TLS without verifying its certificate, as
	// gateways do (pickers' certificates are usually self-signed).
	TLS bool
}

// Client keeps one gRPC connection per :authority, as Envoy keeps one
// cluster per EPP Service (grpc-go refuses a per-call authority over TLS).
type Client struct {
	addr string
	opts Options

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// New returns a Client of the picker's ext_proc address (host:port).
func New(addr string, opts Options) *Client {
	return &Client{addr: addr, opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

// Conn is the connection whose streams carry authority ("" the address).
func (c *Client) Conn(authority string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[authority]; ok {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.opts.TLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) // as gateways dial pickers
	}
	// Envoy takes answers of any size (a streamed body mutation echoes a
	// whole chunk); gRPC clients stop at 4 MiB unless told otherwise.
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32))}
	if authority != "" {
		dopts = append(dopts, grpc.WithAuthority(authority))
	}
	cc, err := grpc.NewClient("passthrough:///"+c.addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("eppclient: ext_proc client for %s (authority %q): %w", c.addr, authority, err)
	}
	c.conns[authority] = cc
	return cc, nil
}

// Header is one request or response header.
type Header struct{ Key, Value string }

// Request is one HTTP request as the gateway hands it to the picker.
type Request struct {
	Shape Shape
	// Authority is the :authority the gateway dials the picker with.
	Authority string
	// Headers are the request headers; FullDuplex and Buffered prepend
	// :method POST, :path /v1/completions and :scheme http unless given.
	Headers []Header
	// Body is the request body; empty: a request without one (GET).
	Body []byte
	// Chunks splits a FullDuplex body into that many messages. Zero: 1.
	Chunks int
	// Subset, when not nil, is sent as the subset hint (metadata_context
	// envoy.lb.subset_hint, key x-gateway-destination-endpoint-subset).
	Subset []string
	// Response, when set, plays the response phase after a routed request.
	Response *Response
	// Forward, when set, is called once the picker routed the request, with
	// its answer so far, as a gateway then forwards the request to the
	// endpoint; the Response it returns (nil: none) is played as Response
	// is, and its error ends Do. It takes Response's place.
	Forward func(ctx context.Context, res *Result) (*Response, error)
	// PoolTag, when set, names the pool (NAMESPACE/NAME) in the stream's
	// gRPC metadata x-gateway-inference-pool, as Envoy's per-route
	// grpc_initial_metadata can.
	PoolTag string
}

// Response is the model server's answer as the gateway reports it.
type Response struct {
	Status int
	// Headers beside :status; content-type application/json unless given.
	Headers []Header
	Body    []byte
	// Stream, when set, is the body in place of Body, sent as it is read,
	// a message a read, as Envoy streams a response body in
	// FULL_DUPLEX_STREAMED mode (the picker sees the first bytes when the
	// gateway does); Do closes it.
	Stream io.ReadCloser
	// Served, when not empty, is the endpoint the gateway reports as the one
	// that served the request (metadata_context envoy.lb,
	// x-gateway-destination-endpoint-served).
	Served string
	// ServedPrimary reports the picker's primary endpoint as served.
	ServedPrimary bool
}

// Result is what the picker answered on one stream.
type Result struct {
	// Destination is x-gateway-destination-endpoint as the picker set it
	// in a header mutation, and DestinationIn the phase whose answer
	// carried it first ("request_headers" or "request_body").
	Destination, DestinationIn string
	// Metadata is envoy.lb's x-gateway-destination-endpoint in the
	// answers' dynamic metadata.
	Metadata string
	// Immediate is the picker's direct answer to the client, if any.
	Immediate *extprocv3.ImmediateResponse
	// ResponseHeaders are the headers the picker set on the response.
	ResponseHeaders map[string]string
	// Answers counts the picker's messages.
	Answers int
	// Decided is the time from opening the stream to the answer that
	// carried the destination or the immediate response: the latency a
	// gateway waits before it can forward the request.
	Decided time.Duration
}

// Endpoints are the destinations in order (primary, then fallbacks).
func (r *Result) Endpoints() []string {
	if r.Destination == "" {
		return nil
	}
	return strings.Split(r.Destination, ",")
}

// Do runs one stream. A gRPC error of the stream is returned as is, so
// callers can read its status.
func (c *Client) Do(ctx context.Context, req Request) (*Result, error) {
	cc, err := c.Conn(req.Authority)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if req.PoolTag != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKeyPoolTag, req.PoolTag)
	}
	start := time.Now()
	s, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	st := &stream{s: s, start: start, res: &Result{ResponseHeaders: map[string]string{}}, cancel: cancel}
	if err := st.request(req); err != nil {
		return st.res, err
	}
	resp := req.Response
	if req.Forward != nil && st.res.Immediate == nil && st.res.Destination != "" {
		if resp, err = req.Forward(ctx, st.res); err != nil {
			return st.res, err
		}
	}
	if resp != nil && resp.Stream != nil {
		defer resp.Stream.Close()
	}
	if st.res.Immediate != nil || resp == nil || req.Shape == NGF || st.res.Destination == "" {
		if err := s.CloseSend(); err != nil {
			return st.res, err
		}
		return st.res, st.drain()
	}
	if err := st.response(resp); err != nil {
		return st.res, err
	}
	if err := s.CloseSend(); err != nil {
		return st.res, err
	}
	return st.res, st.drain()
}

type stream struct {
	s      extprocv3.ExternalProcessor_ProcessClient
	start  time.Time
	res    *Result
	cancel context.CancelFunc
}

// recv reads one answer and notes what it says.
func (st *stream) recv(phase string) (*extprocv3.ProcessingResponse, error) {
	m, err := st.s.Recv()
	if err != nil {
		return nil, err
	}
	st.res.Answers++
	if f := m.GetDynamicMetadata().GetFields()[MetadataNamespaceLB]; f != nil {
		if v := f.GetStructValue().GetFields()[HeaderDestination]; v != nil && st.res.Metadata == "" {
			st.res.Metadata = v.GetStringValue()
		}
	}
	var common *extprocv3.CommonResponse
	switch r := m.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		st.res.Immediate = r.ImmediateResponse
		st.res.Decided = time.Since(st.start)
	case *extprocv3.ProcessingResponse_RequestHeaders:
		common = r.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		common = r.RequestBody.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		common = r.ResponseHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseBody:
		common = r.ResponseBody.GetResponse()
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		k, v := h.GetHeader().GetKey(), headerValue(h.GetHeader())
		if strings.HasPrefix(phase, "request") {
			if k == HeaderDestination && st.res.Destination == "" {
				st.res.Destination, st.res.DestinationIn = v, phase
				st.res.Decided = time.Since(st.start)
			}
		} else {
			st.res.ResponseHeaders[k] = v
		}
	}
	return m, nil
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func (st *stream) send(m *extprocv3.ProcessingRequest) error {
	if err := st.s.Send(m); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func (st *stream) request(req Request) error {
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: requestHeaders(req), EndOfStream: len(req.Body) == 0}}}
	switch req.Shape {
	case FullDuplex:
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	case Buffered:
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}
	}
	if req.Subset != nil {
		list := make([]any, len(req.Subset))
		for i, s := range req.Subset {
			list[i] = s
		}
		hint, err := structpb.NewStruct(map[string]any{MetadataKeySubset: list})
		if err != nil {
			return err
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceHint: hint}}
	}
	// Envoy forwards the filter metadata on every message of the request,
	// its body chunks too: a picker may read it from any of them.
	body := func(b []byte, eos bool) *extprocv3.ProcessingRequest {
		m := bodyMessage(b, eos)
		m.MetadataContext = first.MetadataContext
		return m
	}
	if err := st.send(first); err != nil {
		return err
	}
	if len(req.Body) == 0 {
		_, err := st.recv("request_headers")
		return err
	}
	switch req.Shape {
	case Buffered:
		// The gateway waits for the headers' answer before the body.
		if _, err := st.recv("request_headers"); err != nil || st.res.Immediate != nil {
			return err
		}
		if err := st.send(body(req.Body, true)); err != nil {
			return err
		}
		_, err := st.recv("request_body")
		return err
	case NGF:
		if err := st.send(body(req.Body, true)); err != nil {
			return err
		}
		if err := st.s.CloseSend(); err != nil {
			return err
		}
		for st.res.Immediate == nil {
			m, err := st.recv(phaseOf(st.res))
			if err != nil {
				return err
			}
			if m.GetRequestBody() != nil {
				return nil
			}
		}
		return nil
	}
	n := max(req.Chunks, 1)
	size := (len(req.Body) + n - 1) / n
	for off := 0; off < len(req.Body); off += size {
		end := min(off+size, len(req.Body))
		if err := st.send(body(req.Body[off:end], end == len(req.Body))); err != nil {
			return err
		}
	}
	// The headers' answer, then streamed body mutations until the last.
	for st.res.Immediate == nil {
		m, err := st.recv(phaseOf(st.res))
		if err != nil {
			return err
		}
		if b := m.GetRequestBody(); b != nil {
			sr := b.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil || sr.GetEndOfStream() {
				return nil
			}
		}
	}
	return nil
}

// phaseOf names the answer expected next in the request phase: the headers'
// until one arrived.
func phaseOf(r *Result) string {
	if r.Answers == 0 {
		return "request_headers"
	}
	return "request_body"
}

func (st *stream) response(r *Response) error {
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: fmt.Appendf(nil, "%d", r.Status)}}}
	ct := false
	for _, h := range r.Headers {
		ct = ct || h.Key == "content-type"
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	if !ct {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")})
	}
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs, EndOfStream: len(r.Body) == 0 && r.Stream == nil}}}
	served := r.Served
	if r.ServedPrimary {
		served = st.res.Endpoints()[0]
	}
	if served != "" {
		md, err := structpb.NewStruct(map[string]any{MetadataKeyServed: served})
		if err != nil {
			return err
		}
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceLB: md}}
	}
	if err := st.send(m); err != nil {
		return err
	}
	if _, err := st.recv("response_headers"); err != nil || r.Stream != nil {
		if err == nil {
			err = st.streamBody(r.Stream, m.MetadataContext)
		}
		return err
	}
	if len(r.Body) == 0 {
		return nil
	}
	// As on the request path, the metadata comes with the body too.
	b := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: r.Body, EndOfStream: true}},
		MetadataContext: m.MetadataContext}
	if err := st.send(b); err != nil {
		return err
	}
	_, err := st.recv("response_body")
	return err
}

// streamBody sends body as it is read, a message a read, the last one
// ending the stream (empty when the read that found the end brought
// nothing), while the picker's answers are read meanwhile: the picker
// answers each message, and a body longer than the stream's window
// would otherwise wait for answers nobody reads.
func (st *stream) streamBody(body io.Reader, md *corev3.Metadata) error {
	answers := make(chan error, 1)
	go func() {
		for {
			if _, err := st.recv("response_body"); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				answers <- err
				return
			}
		}
	}()
	err := st.sendBody(body, md)
	if err == nil {
		err = st.s.CloseSend()
	}
	if err != nil {
		// The stream ends, and with it the reads.
		st.cancel()
		<-answers
		return err
	}
	return <-answers
}

// sendBody sends body's reads as response body messages.
func (st *stream) sendBody(body io.Reader, md *corev3.Metadata) error {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
		eos := errors.Is(rerr, io.EOF)
		if n > 0 || eos {
			m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
				Body: slices.Clone(buf[:n]), EndOfStream: eos}}, MetadataContext: md}
			if err := st.send(m); err != nil {
				return err
			}
		}
		if eos {
			return nil
		}
	}
}

// drain reads until the picker ends the stream.
func (st *stream) drain() error {
	for {
		if _, err := st.recv("trailing"); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func bodyMessage(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// requestHeaders are the headers of req as its shape sends them.
func requestHeaders(req Request) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	if req.Shape == NGF {
		for _, h := range req.Headers {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(h.Key), Value: h.Value})
		}
		return hm
	}
	has := map[string]bool{}
	for _, h := range req.Headers {
		has[h.Key] = true
	}
	for _, d := range []Header{{":method", "POST"}, {":path", "/v1/completions"}, {":scheme", "http"}} {
		if !has[d.Key] {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: d.Key, RawValue: []byte(d.Value)})
		}
	}
	for _, h := range req.Headers {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	return hm
}

// CheckServing asks the gRPC health service svc at addr (plaintext, as
// pickers serve health) with Check, the call Kubernetes' gRPC probes and
// gateways' health checks make, until it reports SERVING or ctx ends. A
// server that does not know svc (NotFound) fails at once: it will not
// learn it later. Check pushes nothing, so the answer is polled, backing
// off to 200ms.
func CheckServing(ctx context.Context, addr, svc string) error {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}, grpc.WaitForReady(true))
		switch {
		case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return nil
		case err == nil:
			err = fmt.Errorf("status %s", resp.GetStatus())
		case status.Code(err) == codes.NotFound:
			return fmt.Errorf("health service %q at %s: %w", svc, addr, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("health service %q at %s: %w", svc, addr, err)
		case <-time.After(wait):
		}
	}
}

// WaitServing watches the gRPC health service svc at addr (plaintext, as
// pickers serve health) until it reports SERVING or ctx ends.
func WaitServing(ctx context.Context, addr, svc string) error {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	s, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: svc}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return fmt.Errorf("health service %q at %s: %w", svc, addr, err)
		}
		if m.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}
