// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// readServed moves the in-flight count to the endpoint that actually served
// the request, when the gateway reports a fallback.
func (st *stream) readServed(mc *corev3.Metadata) {
	s, ok := mc.GetFilterMetadata()[MetadataNamespaceLB]
	if !ok {
		return
	}
	served, ok := structString(s, HeaderDestinationServed)
	if !ok || served == "" || st.servedSeen {
		return
	}
	if err := labelvalue.Check(served, maxAddressBytes); err != nil {
		// It is echoed in a header (conformance) and compared, never
		// trusted: a report that is no address is no report.
		st.s.log.V(2).Info("ignoring an invalid served endpoint", "pool", st.poolName, "request", st.requestID, "err", err.Error())
		return
	}
	st.servedSeen, st.served = true, served
	st.req.Served(served)
}

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders) error {
	if st.state != stateForwarded {
		return st.unexpected("response headers")
	}
	st.state = stateResponse
	for _, hv := range h.GetHeaders().GetHeaders() {
		// The response's content type decides; the request's stream flag
		// is only a guess for responses that carry none.
		if strings.EqualFold(hv.GetKey(), "content-type") {
			st.usage.sse = strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream")
		}
	}
	common := &extprocv3.CommonResponse{}
	if st.s.opts.EnableConformanceTestBehaviors {
		// A gateway that does not report the endpoint that served must be
		// visible to the suite, so its absence is echoed, not the pick.
		served := st.served
		if served == "" {
			served = conformanceServedMissing
		}
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderConformanceServed, served)}}
	}
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	if h.GetEndOfStream() {
		st.state = stateDone
		st.finish("completed", true)
	}
	return nil
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if st.state != stateResponse {
		return st.unexpected("response body")
	}
	st.usage.write(b.GetBody())
	if st.usage.sse && st.respBytes == 0 && len(b.GetBody()) > 0 {
		st.firstByte = time.Now()
	}
	st.respBytes += len(b.GetBody())
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	resp, _ := bodyAnswer(true, st.respReply == replyStreamed, b.GetBody(), eos)
	if err := st.send(resp); err != nil {
		return err
	}
	if eos {
		st.state = stateDone
		st.finish("completed", true)
	}
	return nil
}

func (st *stream) onResponseTrailers() error {
	if st.state != stateResponse && st.state != stateDone {
		return st.unexpected("response trailers")
	}
	st.state = stateDone
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}); err != nil {
		return err
	}
	st.finish("completed", true)
	return nil
}

// finish ends the request's accounting exactly once.
func (st *stream) finish(outcome string, completed bool) {
	if st.req.Finished() {
		return
	}
	if st.trace.span != nil {
		st.trace.end(outcome)
	}
	if st.req.Endpoint() != nil {
		st.s.metrics.ended(st.labels)
	}
	st.req.Finish()
	if completed {
		u, ok := st.usage.finish()
		var ttft time.Duration
		if !st.firstByte.IsZero() {
			ttft = st.firstByte.Sub(st.start)
		}
		st.s.metrics.completed(st.labels, time.Since(st.start), ttft, st.respBytes, u, ok)
		if ok && u.HasCachedTokens {
			// The prefix index checks its prediction against the server.
			st.req.ObserveResponse(u.CachedTokens, u.PromptTokens, ttft)
		}
	}
	if log := st.s.log.V(5); st.req.Endpoint() != nil && log.Enabled() {
		log.Info("request finished", "pool", st.poolName, "request", st.requestID, "outcome", outcome, "endpoint", st.req.Endpoint().Address)
	}
}
