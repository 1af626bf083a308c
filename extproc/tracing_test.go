// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/otlptest"
	"github.com/poolpicker/poolpicker/internal/tracing"
)

// TestTracing runs the real server with a tracer provider built from the
// OTEL_* environment, exporting over OTLP/gRPC to a receiver on loopback, and
// checks each request's span: its attributes, its parent (the incoming
// traceparent), and the traceparent set on the forwarded request.
func TestTracing(t *testing.T) {
	recv := otlptest.Start(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.Endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "picker-under-test")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	p, warnings, err := tracing.New(context.Background(), tracing.Config{Version: "v-test"})
	if err != nil || p == nil || len(warnings) > 0 {
		t.Fatalf("tracing.New: %v, %v, warnings %q", p, err, warnings)
	}

	reg := datastore.NewRegistry()
	f := &poolFixture{reg: reg}
	for i := 0; i < 3; i++ {
		f.add(i, poolNS(i), poolName(i), poolSvc(i), 9002, 2)
	}
	ts := startServer(t, reg, leastInFlight{}, Options{Insecure: true, Tracer: p.Tracer})

	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	cases := []struct {
		name        string
		authority   string
		md          metadata.MD
		wantSource  string // the resolution source of a routed request
		traceparent string
		wantParent  string // the incoming span id, or "" for a root span
		wantCode    int    // 0: routed
		wantSampled bool   // the span is exported
	}{
		{name: "continues the client's sampled trace", authority: authorityOf(1), wantSource: "authority",
			traceparent: "00-" + clientTrace + "-00f067aa0ba902b7-01", wantParent: "00f067aa0ba902b7", wantSampled: true},
		{name: "starts a trace without traceparent", md: metadata.Pairs(hdrPoolTag, poolNS(2)+"/"+poolName(2)), wantSource: "grpc metadata", wantSampled: true},
		{name: "a malformed traceparent starts a new trace", authority: authorityOf(2), wantSource: "authority", traceparent: "00-zz-00f067aa0ba902b7-01", wantSampled: true},
		{name: "the client's unsampled decision is kept", authority: authorityOf(1), wantSource: "authority",
			traceparent: "00-" + clientTrace + "-00f067aa0ba902b8-00", wantSampled: false},
		{name: "unknown pool: error span", md: metadata.Pairs(hdrPoolTag, "ns-1/nope"), wantCode: 404, wantSampled: true},
	}
	type sent struct {
		id, dest, forwarded string
	}
	results := make([]sent, len(cases))
	for i, c := range cases {
		id := "trace-req-" + strconv.Itoa(i)
		extra := []hdr{{"x-request-id", id, true}}
		if c.traceparent != "" {
			extra = append(extra, hdr{"traceparent", c.traceparent, true})
		}
		g := ts.open(t, c.authority, c.md)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", extra...), false), duplex, duplex))
		if c.wantCode == 0 { // a refusal answers the headers and closes
			g.send(reqBody(completionBody("m", i), true))
		}
		resp := g.recv()
		results[i].id = id
		if c.wantCode != 0 {
			if code, _ := immediateCode(t, resp); code != c.wantCode {
				t.Fatalf("%s: status %d, want %d", c.name, code, c.wantCode)
			}
			g.expectEOF() // the span ends before the stream does
			continue
		}
		m := resp.GetRequestHeaders().GetResponse().GetHeaderMutation()
		results[i].dest = destination(t, resp, m)
		results[i].forwarded, _ = mutationHeader(m, "traceparent")
		_ = g.recv() // the body answer
		g.send(respHeaders([]hdr{{":status", "200", true}}, false, results[i].dest))
		_ = g.recv()
		g.send(respBody([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":2}}`), true))
		_ = g.recv()
		_ = g.stream.CloseSend()
		g.expectEOF() // the span ends before the stream does
	}
	// Shutdown exports every ended span before returning: what is not in
	// the receiver then was never recorded.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := map[string]otlptest.Span{}
	for _, s := range recv.Spans() {
		spans[s.Attrs[string(AttrRequestID)]] = s
	}

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := results[i]
			s, ok := spans[r.id]
			if ok != c.wantSampled {
				t.Fatalf("span exported %v, want %v (spans: %v)", ok, c.wantSampled, recv.Spans())
			}
			if c.wantCode == 0 {
				// The forwarded request carries the picker's span as parent
				// whether sampled or not, so downstream keeps the decision.
				parts := strings.Split(r.forwarded, "-")
				if len(parts) != 4 {
					t.Fatalf("forwarded traceparent %q", r.forwarded)
				}
				if c.wantParent != "" && parts[1] != clientTrace {
					t.Errorf("forwarded trace id %s, want the client's %s", parts[1], clientTrace)
				}
				if wantFlags := map[bool]string{true: "01", false: "00"}[c.wantSampled]; parts[3] != wantFlags {
					t.Errorf("forwarded flags %s, want %s", parts[3], wantFlags)
				}
				if ok && parts[2] != hex.EncodeToString(s.SpanID) {
					t.Errorf("forwarded parent span %s, want the picker's span %x", parts[2], s.SpanID)
				}
			}
			if !ok {
				return
			}
			if s.Name != SpanName || s.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span %q kind %v, want %q server", s.Name, s.Kind, SpanName)
			}
			if got := hex.EncodeToString(s.ParentID); got != c.wantParent {
				t.Errorf("parent span %q, want %q", got, c.wantParent)
			}
			if c.wantParent != "" && hex.EncodeToString(s.TraceID) != clientTrace {
				t.Errorf("trace id %x, want the client's %s", s.TraceID, clientTrace)
			}
			if s.Resource["service.name"] != "picker-under-test" || s.Resource["service.version"] != "v-test" {
				t.Errorf("resource %v: want OTEL_SERVICE_NAME and the version", s.Resource)
			}
			if c.wantCode != 0 {
				if s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || s.Attrs[string(AttrHTTPStatus)] != strconv.Itoa(c.wantCode) ||
					s.Attrs[string(AttrErrorReason)] != "UnknownPool" {
					t.Errorf("error span: status %v, attributes %v", s.Status, s.Attrs)
				}
				return
			}
			pool, found := poolOfAddress(f, strings.Split(r.dest, ",")[0])
			if !found {
				t.Fatalf("destination %q is in no pool", r.dest)
			}
			want := map[string]string{
				string(AttrPool):             pool.Key.String(),
				string(AttrPoolNamespace):    pool.Key.Namespace,
				string(AttrPoolName):         pool.Key.Name,
				string(AttrResolutionSource): c.wantSource,
				string(AttrEndpoint):         r.dest,
				string(AttrModel):            "m",
				string(AttrTargetModel):      "m",
				string(AttrOutcome):          "completed",
			}
			for k, v := range want {
				if s.Attrs[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, s.Attrs[k], v)
				}
			}
			if d, err := strconv.ParseFloat(s.Attrs[string(AttrSchedulingTime)], 64); err != nil || d <= 0 || d > 5 {
				t.Errorf("scheduling time %q: want seconds > 0", s.Attrs[string(AttrSchedulingTime)])
			}
			if s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("routed request's span has error status %v", s.Status)
			}
		})
	}
}

// poolOfAddress returns the fixture pool holding an endpoint address.
func poolOfAddress(f *poolFixture, addr string) (*datastore.Pool, bool) {
	for _, p := range f.pools {
		if _, ok := p.Endpoints().Get(addr); ok {
			return p, true
		}
	}
	return nil, false
}
