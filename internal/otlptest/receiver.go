// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package otlptest is an OTLP trace receiver on loopback for tests: a real
// gRPC server implementing the collector's TraceService, keeping the spans
// it is sent.
package otlptest

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is a received span with its attributes (and its resource's) as text.
type Span struct {
	Name     string
	TraceID  []byte
	SpanID   []byte
	ParentID []byte
	Kind     tracepb.Span_SpanKind
	Status   *tracepb.Status
	Attrs    map[string]string
	Resource map[string]string
}

// Receiver collects the spans exported to it.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is the receiver's address as OTEL_EXPORTER_OTLP_ENDPOINT
	// takes it: http://127.0.0.1:PORT.
	Endpoint string

	mu      sync.Mutex
	spans   []Span
	arrived chan struct{} // closed and replaced on each export
}

// Start serves a receiver on a free loopback port until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Endpoint: "http://" + lis.Addr().String(), arrived: make(chan struct{})}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
}

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := attrText(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					Name: s.GetName(), TraceID: s.GetTraceId(), SpanID: s.GetSpanId(), ParentID: s.GetParentSpanId(),
					Kind: s.GetKind(), Status: s.GetStatus(), Attrs: attrText(s.GetAttributes()), Resource: res,
				})
			}
		}
	}
	close(r.arrived)
	r.arrived = make(chan struct{})
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// WaitFor returns the first received span that match accepts, waiting for
// exports until timeout; ok is false if none came.
func (r *Receiver) WaitFor(timeout time.Duration, match func(Span) bool) (Span, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for _, s := range r.spans {
			if match(s) {
				r.mu.Unlock()
				return s, true
			}
		}
		arrived := r.arrived
		r.mu.Unlock()
		select {
		case <-arrived:
		case <-deadline.C:
			return Span{}, false
		}
	}
}

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

func attrText(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = x.StringValue
		default:
			out[kv.GetKey()] = anyText(v)
		}
	}
	return out
}

func anyText(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	}
	return v.String()
}
