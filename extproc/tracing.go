// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/poolpicker/poolpicker/datastore"
)

// SpanName is the name of the span of one request, upstream EPP's.
const SpanName = "gateway.request"

// W3C trace context headers: read from the request to continue the
// client's trace, and set on the forwarded request so that the model
// server's spans are children of the picker's.
const (
	hdrTraceParent = "traceparent"
	hdrTraceState  = "tracestate"
)

// Span attributes of a request. The pool is given whole and split, so
// that a trace backend can filter on a namespace.
const (
	AttrPool             = attribute.Key("poolpicker.pool")
	AttrPoolNamespace    = attribute.Key("poolpicker.pool.namespace")
	AttrPoolName         = attribute.Key("poolpicker.pool.name")
	AttrResolutionSource = attribute.Key("poolpicker.pool.resolution_source")
	AttrRequestID        = attribute.Key("poolpicker.request_id")
	AttrModel            = attribute.Key("poolpicker.model")
	AttrTargetModel      = attribute.Key("poolpicker.target_model")
	AttrEndpoint         = attribute.Key("poolpicker.endpoint")
	AttrSchedulingTime   = attribute.Key("poolpicker.scheduling.duration_seconds")
	AttrOutcome          = attribute.Key("poolpicker.outcome")
	AttrErrorReason      = attribute.Key("poolpicker.error.reason")
	AttrHTTPStatus       = attribute.Key("http.response.status_code")
)

// traceContext is the W3C propagator; the picker uses no other format
// whatever the process-wide propagator is.
var traceContext = propagation.TraceContext{}

// traceState is a stream's span. Every method but the header fields is
// called only when span is set, so a server without a tracer pays two
// unused string fields per stream.
type traceState struct {
	parent, state string // incoming traceparent, tracestate
	span          trace.Span
	ctx           context.Context // carries span, for injection
}

// start opens the request's span, a child of the incoming traceparent when
// the request carries a valid one.
func (t *traceState) start(ctx context.Context, tracer trace.Tracer, at time.Time, requestID string) {
	if t.parent != "" {
		carrier := propagation.MapCarrier{hdrTraceParent: t.parent}
		if t.state != "" {
			carrier[hdrTraceState] = t.state
		}
		ctx = traceContext.Extract(ctx, carrier)
	}
	t.ctx, t.span = tracer.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(at))
	if requestID != "" {
		t.span.SetAttributes(AttrRequestID.String(requestID))
	}
}

func (t *traceState) resolved(pool *datastore.Pool, source string) {
	t.span.SetAttributes(
		AttrPool.String(pool.Key.String()),
		AttrPoolNamespace.String(pool.Key.Namespace),
		AttrPoolName.String(pool.Key.Name),
		AttrResolutionSource.String(source),
	)
}

func (t *traceState) scheduled(model string, took time.Duration) {
	t.span.SetAttributes(AttrModel.String(model), AttrSchedulingTime.Float64(took.Seconds()))
}

// picked records the decision and adds the span's traceparent to the
// headers set on the forwarded request.
func (t *traceState) picked(set []*corev3.HeaderValueOption, dest, target string) []*corev3.HeaderValueOption {
	t.span.SetAttributes(AttrEndpoint.String(dest), AttrTargetModel.String(target))
	if !t.span.SpanContext().IsValid() {
		return set
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(t.ctx, carrier)
	for _, k := range []string{hdrTraceParent, hdrTraceState} {
		if v, ok := carrier[k]; ok {
			set = append(set, setHeader(k, v))
		}
	}
	return set
}

func (t *traceState) failed(e *httpError) {
	t.span.SetAttributes(AttrHTTPStatus.Int(e.code), AttrErrorReason.String(e.reason))
	t.span.SetStatus(codes.Error, strconv.Itoa(e.code)+" "+e.reason+": "+e.msg)
}

func (t *traceState) end(outcome string) {
	t.span.SetAttributes(AttrOutcome.String(outcome))
	if outcome == "error" || outcome == "canceled" {
		t.span.SetStatus(codes.Error, "ext_proc stream "+outcome)
	}
	t.span.End()
}
