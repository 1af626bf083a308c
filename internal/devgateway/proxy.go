// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"syscall"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
)

func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func shuffle(s []string) {
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}

func copyResponseHeaders(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, h := range hopByHop {
		dst.Del(h)
	}
	dst.Del("Content-Length") // the picker may change the body
}

// passThrough copies a response to the client without ext_proc.
func (g *Gateway) passThrough(w http.ResponseWriter, resp *http.Response, served string) {
	copyResponseHeaders(w.Header(), resp.Header)
	w.Header().Set(HeaderServedEndpoint, served)
	w.WriteHeader(resp.StatusCode)
	g.countStatus(resp.StatusCode)
	_ = copyFlushing(w, resp.Body, nil) // a client gone mid-copy ends the request; nothing to answer
}

// copyFlushing copies src to w, flushing after every read so that SSE events
// reach the client as they are produced. It writes prefix first.
func copyFlushing(w http.ResponseWriter, src io.Reader, prefix []byte) error {
	f, _ := w.(http.Flusher)
	if len(prefix) > 0 {
		if _, err := w.Write(prefix); err != nil {
			return err
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if f != nil {
				f.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func responseHeaderMap(resp *http.Response) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(fmt.Sprint(resp.StatusCode))}}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: lower(k), RawValue: []byte(v)})
		}
	}
	return hm
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// pendingBytes are response bytes sent to the picker and not yet streamed
// back by it; they are what the client would lose if the stream broke.
type pendingBytes struct {
	mu  sync.Mutex
	buf []byte
}

func (p *pendingBytes) add(b []byte) {
	p.mu.Lock()
	p.buf = append(p.buf, b...)
	p.mu.Unlock()
}

func (p *pendingBytes) consume(n int) {
	p.mu.Lock()
	p.buf = p.buf[min(n, len(p.buf)):]
	p.mu.Unlock()
}

func (p *pendingBytes) take() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.buf
	p.buf = nil
	return b
}

// sendResult is how the response-body sender ended.
type sendResult struct {
	// upstreamErr: the upstream body failed mid-way.
	upstreamErr error
	// streamErr: the ext_proc stream refused a message.
	streamErr error
}

// respond runs the response phase: response headers (with the served
// endpoint in metadata_context envoy.lb) and body chunks go to the picker,
// and its answers (header mutations, streamed body) go to the client. If the
// stream breaks, the rest of the response passes through unprocessed.
func (g *Gateway) respond(ctx context.Context, w http.ResponseWriter, ex *exchange, resp *http.Response, served string, log logr.Logger) {
	err := ex.stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: responseHeaderMap(resp),
		}},
		MetadataContext: servedMetadata(served),
	})
	var headersResp *extprocv3.ProcessingResponse
	if err == nil {
		for r := range ex.responses {
			if _, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders); ok {
				headersResp = r
				break
			}
			if _, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
				headersResp = r
				break
			}
		}
	}
	if headersResp == nil {
		// The picker closed the stream after the request (NGF-style) or it
		// broke: the response is not processed.
		g.lostResponsePhase(ex, log, err)
		g.passThrough(w, resp, served)
		return
	}
	if ir := headersResp.GetImmediateResponse(); ir != nil {
		g.count(func(s *Stats) { s.ImmediateResponses++ })
		g.writeImmediate(w, ir)
		return
	}
	copyResponseHeaders(w.Header(), resp.Header)
	applyHeaderMutation(w.Header(), headersResp.GetResponseHeaders().GetResponse().GetHeaderMutation())
	w.Header().Set(HeaderServedEndpoint, served)
	w.WriteHeader(resp.StatusCode)
	g.countStatus(resp.StatusCode)
	flusher, _ := w.(http.Flusher)

	pending := &pendingBytes{}
	sent := make(chan sendResult, 1)
	go func() {
		sent <- sendBody(ex, resp.Body, pending)
	}()
	sender := sent
	for {
		select {
		case res := <-sender:
			sender = nil
			if res.upstreamErr != nil {
				// The model server died mid-response: cut the client too,
				// as a proxy must, and let the picker see the stream end.
				log.Info("upstream response broken", "endpoint", served, "err", res.upstreamErr.Error())
				ex.close()
				panic(http.ErrAbortHandler)
			}
		case r, ok := <-ex.responses:
			if !ok {
				if sender != nil {
					res := <-sender
					if res.upstreamErr != nil {
						panic(http.ErrAbortHandler)
					}
				}
				g.lostResponsePhase(ex, log, ex.recvErr)
				_ = copyFlushing(w, resp.Body, pending.take())
				return
			}
			body := r.GetResponseBody()
			if body == nil {
				if r.GetImmediateResponse() != nil {
					// Too late for a status: the headers are out.
					log.Info("immediate response after the response headers; cutting the response")
					ex.close()
					panic(http.ErrAbortHandler)
				}
				continue
			}
			var chunk []byte
			eos := false
			switch m := body.GetResponse().GetBodyMutation().GetMutation().(type) {
			case *extprocv3.BodyMutation_StreamedResponse:
				chunk, eos = m.StreamedResponse.GetBody(), m.StreamedResponse.GetEndOfStream()
			default:
				// No mutation: the chunk passes unchanged (one answer per
				// chunk sent, so the pending bytes are the chunk).
				chunk = pending.take()
			}
			pending.consume(len(chunk))
			if len(chunk) > 0 {
				if _, err := w.Write(chunk); err != nil {
					ex.close()
					return
				}
				if flusher != nil {
					flusher.Flush()
				}
			}
			if eos {
				if sender != nil {
					<-sender
				}
				_ = ex.stream.CloseSend()
				ex.close()
				return
			}
		case <-ctx.Done():
			ex.close()
			if sender != nil {
				<-sender
			}
			return
		}
	}
}

func (g *Gateway) lostResponsePhase(ex *exchange, log logr.Logger, err error) {
	ex.close()
	if err == nil {
		err = ex.recvErr
	}
	if err == nil {
		log.V(4).Info("picker ended the stream before the response phase")
		return
	}
	g.count(func(s *Stats) { s.ResponsePhaseLost++ })
	log.Info("ext_proc stream broke in the response phase; passing the response through", "err", err.Error())
}

// sendBody streams the upstream body to the picker in the chunks it arrives
// in, then an empty end-of-stream chunk.
func sendBody(ex *exchange, body io.Reader, pending *pendingBytes) sendResult {
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			pending.add(chunk)
			if serr := ex.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: chunk},
			}}); serr != nil {
				return sendResult{streamErr: serr}
			}
		}
		if errors.Is(err, io.EOF) {
			if serr := ex.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{EndOfStream: true},
			}}); serr != nil {
				return sendResult{streamErr: serr}
			}
			return sendResult{}
		}
		if err != nil {
			return sendResult{upstreamErr: err}
		}
	}
}
