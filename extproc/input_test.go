// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// TestNonUTF8ModelRewriteHeader is the report of issue 22: a model rewrite
// header whose raw value is not UTF-8 reached a Prometheus label, whose
// panic ended the process. It must be answered 400, and the server go on.
func TestNonUTF8ModelRewriteHeader(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	for _, name := range []string{hdrModelRewrite, hdrModelRewriteDeprecated} {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{name, "\xff\xfe\xfd", true}), false), duplex, duplex))
		_ = g.stream.Send(reqBody(completionBody("m", 1), true)) // the answer may already have ended the stream
		code, body := immediateCode(t, g.recv())
		if code != 400 || !strings.Contains(errorBodyOf(t, body).Error.Message, name) {
			t.Fatalf("%s: status %d %s, want 400 naming the header", name, code, body)
		}
	}
	routeOnce(t, ts, f, 0)
}

// actedHeaders are the request headers the picker acts on (with the
// options that make it read them), each with a valid value.
var actedHeaders = []hdr{
	{":path", "/v1/completions", true},
	{":method", "POST", true},
	{"content-length", "10", true},
	{hdrObjective, "o", true},
	{hdrObjectiveDeprecated, "o", true},
	{hdrModelRewrite, "m", true},
	{hdrModelRewriteDeprecated, "m", true},
	{hdrEPPHost, "x", true},
	{hdrEPPPort, "9002", true},
	{hdrPoolTag, "ns-0/pool-0", true},
	{HeaderConformanceSelection, "127.0.1.2", true},
}

// badValues are values no header may carry: not UTF-8, a control byte,
// and longer than any bound of input.go.
var badValues = map[string]string{
	"not UTF-8":   "\xff\xfe\xfd",
	"NUL":         "a\x00b",
	"newline":     "a\nb",
	"C1 control":  "a\u0085",
	"64 KiB long": strings.Repeat("a", 64<<10),
}

// TestInvalidHeaderValues sends every bad value in every header the picker
// acts on, in raw_value and in value (where protobuf allows it: a string
// field is UTF-8), and wants a 400 naming the header, no series with the
// value, and the server routing afterwards.
func TestInvalidHeaderValues(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, TrustPoolHeader: true, EnableConformanceTestBehaviors: true})
	for _, h := range actedHeaders {
		for what, bad := range badValues {
			for _, raw := range []bool{true, false} {
				if !raw && what == "not UTF-8" {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/raw=%v", h.k, what, raw), func(t *testing.T) {
					hs := envoyHeaders("POST", "/v1/completions")
					if h.k == ":path" || h.k == ":method" {
						hs = hs[2:] // send the bad one in their place
					}
					g := ts.open(t, authorityOf(0), nil)
					g.send(withProtocol(reqHeaders(append(hs, hdr{h.k, bad, raw}), false), duplex, duplex))
					_ = g.stream.Send(reqBody(completionBody("m", 1), true))
					code, body := immediateCode(t, g.recv())
					if msg := errorBodyOf(t, body).Error.Message; code != 400 || !strings.Contains(msg, "request header "+h.k+" ") {
						t.Fatalf("status %d %s, want 400 naming %s", code, body, h.k)
					}
				})
			}
		}
	}
	checkSeriesValid(t, ts)
	routeOnce(t, ts, f, 0)
	routeOnce(t, ts, f, 1)
}

// TestInvalidStreamValues covers the values read from elsewhere than
// request headers: pool tags in gRPC metadata, metadata_context and
// attributes, the subset hint, and the body's model.
func TestInvalidStreamValues(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	long := strings.Repeat("m", labelvalue.MaxBytes+1)
	subset := func(v string) *corev3.Metadata {
		l, _ := structpb.NewList([]any{"127.0.1.2:8000", v})
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{MetadataKeySubset: structpb.NewListValue(l)}}}}
	}
	for _, c := range []struct {
		name, want string
		md         metadata.MD
		mc         *corev3.Metadata
		attrs      map[string]*structpb.Struct
		body       []byte
	}{
		{name: "tag in grpc metadata, long", want: "pool tag x-gateway-inference-pool from grpc metadata is 1025 bytes", md: metadata.Pairs(hdrPoolTag, "ns-0/"+strings.Repeat("p", 1020))},
		{name: "tag in metadata_context, control", want: "from metadata_context gw holds control character U+0000", mc: tagMD("gw", "ns-0/pool\x00-0")},
		{name: "tag in attributes, newline", want: "from attributes gw holds control character U+000A", attrs: map[string]*structpb.Struct{"gw": {Fields: map[string]*structpb.Value{hdrPoolTag: structpb.NewStringValue("ns-0/\npool-0")}}}},
		{name: "subset entry, long", want: "subset hint entry", mc: subset(strings.Repeat("1", 100))},
		{name: "body model, long", want: `"model" is 257 bytes`, body: completionBody(long, 1)},
		{name: "body model, control", want: `"model" holds control character U+0001`, body: []byte(`{"model":"a\u0001b","prompt":"x"}`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := ts.open(t, authorityOf(0), c.md)
			m := withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)
			m.MetadataContext, m.Attributes = c.mc, c.attrs
			g.send(m)
			body := c.body
			if body == nil {
				body = completionBody("m", 1)
			}
			_ = g.stream.Send(reqBody(body, true))
			code, eb := immediateCode(t, g.recv())
			if msg := errorBodyOf(t, eb).Error.Message; code != 400 || !strings.Contains(msg, c.want) {
				t.Fatalf("status %d %s, want 400 saying %q", code, eb, c.want)
			}
		})
	}
	checkSeriesValid(t, ts)
	routeOnce(t, ts, f, 0)
}

// TestRecordedValuesBounded: values the picker only records (the request
// ID) or may ignore (W3C trace context, the served endpoint) never refuse
// a request; they are replaced or dropped.
func TestRecordedValuesBounded(t *testing.T) {
	f := newPools(t, 1, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, EnableConformanceTestBehaviors: true})
	for what, bad := range badValues {
		t.Run(what, func(t *testing.T) {
			g := ts.open(t, authorityOf(0), nil)
			hs := []hdr{{":method", "POST", true}, {":path", "/v1/completions", true}, {hdrRequestID, bad, true}, {hdrTraceParent, bad, true}, {hdrTraceState, bad, true}}
			g.send(withProtocol(reqHeaders(hs, false), duplex, duplex))
			g.send(reqBody(completionBody("m", 1), true))
			hr := g.recv()
			checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
			g.recv() // the body
			served := bad
			if !utf8.ValidString(served) {
				served = "" // metadata is a protobuf string: UTF-8 or nothing
			}
			g.send(respHeaders([]hdr{{":status", "200", true}}, false, served))
			echoed, _ := mutationHeader(g.recv().GetResponseHeaders().GetResponse().GetHeaderMutation(), HeaderConformanceServed)
			if echoed != conformanceServedMissing {
				t.Errorf("served endpoint %.20q echoed as %.40q, want it ignored", bad, echoed)
			}
			g.send(respBody([]byte(`{}`), true))
			g.recv()
			g.expectEOF()
		})
	}
	checkSeriesValid(t, ts)
}

// routeOnce sends a plain request for pool i and checks it is routed there.
func routeOnce(t testing.TB, ts *testServer, f *poolFixture, i int) {
	t.Helper()
	g := ts.open(t, authorityOf(i), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	g.send(reqBody(completionBody("m", 1), true))
	hr := g.recv()
	checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), i)
	if r := g.recv().GetRequestBody(); r == nil {
		t.Fatalf("body not answered")
	}
	g.cancel()
}

// checkSeriesValid gathers the server's registry and checks that every
// label value passes labelvalue.Check: gathering fails on invalid UTF-8.
func checkSeriesValid(t testing.TB, ts *testServer) {
	t.Helper()
	mfs, err := ts.prom.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if err := labelvalue.Check(l.GetValue(), 0); err != nil {
					t.Errorf("%s{%s=%.40q}: %v", mf.GetName(), l.GetName(), l.GetValue(), err)
				}
			}
		}
	}
}
