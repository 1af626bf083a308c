// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/datastore"
)

const (
	duplex   = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered = filterv3.ProcessingMode_BUFFERED
)

func completionBody(model string, pad int) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"prompt":"hello %s","max_tokens":7,"extra":{"k":[1,2,{"x":null}]},"stream":false}`, model, strings.Repeat("a", pad)))
}

func splitChunks(b []byte, n int) [][]byte {
	var out [][]byte
	size := (len(b) + n - 1) / n
	for len(b) > 0 {
		k := min(size, len(b))
		out = append(out, b[:k])
		b = b[k:]
	}
	return out
}

func authorityOf(i int) string { return fmt.Sprintf("%s.%s.svc:9002", poolSvc(i), poolNS(i)) }

// poolOf returns the pool holding the address, failing if it is not pool want.
func checkPool(t testing.TB, f *poolFixture, dest string, want int) []*datastore.Endpoint {
	t.Helper()
	var eps []*datastore.Endpoint
	for _, a := range strings.Split(dest, ",") {
		e, ok := f.pools[want].Endpoints().Get(a)
		if !ok {
			t.Fatalf("destination %s (of %q) is not an endpoint of %s", a, dest, f.pools[want].Key)
		}
		eps = append(eps, e)
	}
	return eps
}

// TestGatewayShapes drives the server with the exact message sequences of
// each gateway family, over TLS and plaintext.
func TestGatewayShapes(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", secure), func(t *testing.T) {
			f := newPools(t, 8, 3)
			f.pools[3].SetPolicy(&datastore.Policy{Rewrites: map[string][]datastore.RewriteTarget{"alias": {{Model: "real-model-v2", Weight: 1}}}})
			ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: !secure, BodyWaitTimeout: 50 * time.Millisecond})

			t.Run("envoy full duplex", func(t *testing.T) {
				// Istio/kgateway/agentgateway/Envoy AI Gateway: protocol_config
				// FULL_DUPLEX_STREAMED both ways; headers, body chunks sent without
				// waiting (last with end_of_stream); later response headers with the
				// served endpoint in metadata_context, response chunks.
				g := ts.open(t, authorityOf(2), nil)
				body := completionBody("m", 300)
				chunks := splitChunks(body, 3)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{"content-length", strconv.Itoa(len(body)), true}), false), duplex, duplex))
				for i, c := range chunks {
					g.send(reqBody(c, i == len(chunks)-1))
				}
				hr := g.recv()
				dest := destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation())
				eps := checkPool(t, f, dest, 2)
				if pool, _ := mutationHeader(hr.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderPool); pool != "ns-2/pool-2" {
					t.Errorf("pool header %q", pool)
				}
				if len(eps) != 3 || eps[0].InFlight() != 1 {
					t.Fatalf("want 3 endpoints with the primary counted, got %q inflight %d", dest, eps[0].InFlight())
				}
				var echoed []byte
				for i := range chunks {
					r := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
					if r == nil {
						t.Fatalf("chunk %d not answered with a streamed mutation", i)
					}
					if r.GetEndOfStream() != (i == len(chunks)-1) {
						t.Errorf("chunk %d end_of_stream=%v", i, r.GetEndOfStream())
					}
					echoed = append(echoed, r.GetBody()...)
				}
				if !bytes.Equal(echoed, body) {
					t.Fatalf("body changed: %s", echoed)
				}
				// The gateway retried on the first fallback: the count moves.
				g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", "application/json", true}}, false, eps[1].Address))
				if g.recv().GetResponseHeaders() == nil {
					t.Fatal("response headers not answered")
				}
				if eps[0].InFlight() != 0 || eps[1].InFlight() != 1 {
					t.Fatalf("served fallback not accounted: primary %d fallback %d", eps[0].InFlight(), eps[1].InFlight())
				}
				out := []byte(`{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
				for i, c := range splitChunks(out, 4) {
					g.send(respBody(c, i == 3))
					r := g.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
					if !bytes.Equal(r.GetBody(), c) || r.GetEndOfStream() != (i == 3) {
						t.Fatalf("response chunk %d not passed through: %v", i, r)
					}
				}
				g.expectEOF()
				if eps[1].InFlight() != 0 {
					t.Fatalf("in-flight left behind: %d", eps[1].InFlight())
				}
			})

			t.Run("buffered", func(t *testing.T) {
				// BUFFERED request body: the gateway sends headers and waits for
				// their answer before sending the whole body in one message.
				g := ts.open(t, authorityOf(4), nil)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), buffered, buffered))
				hr := g.recvWithin(2 * time.Second)
				if hr.GetRequestHeaders() == nil || hr.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
					t.Fatalf("want a plain continue for headers, got %v", hr)
				}
				g.send(reqBody([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true))
				br := g.recv()
				dest := destination(t, br, br.GetRequestBody().GetResponse().GetHeaderMutation())
				eps := checkPool(t, f, dest, 4)
				g.send(respHeaders([]hdr{{":status", "200", true}}, false, ""))
				g.recv()
				g.send(respBody([]byte(`{"usage":{"prompt_tokens":2,"completion_tokens":1}}`), true))
				if r := g.recv().GetResponseBody(); r == nil || r.GetResponse().GetBodyMutation() != nil {
					t.Fatalf("buffered response body must be answered with a plain continue, got %v", r)
				}
				g.expectEOF()
				if eps[0].InFlight() != 0 {
					t.Fatal("in-flight left behind")
				}
			})

			t.Run("nginx gateway fabric shim", func(t *testing.T) {
				// NGF's shim: no protocol_config, lower-case names, values in Value,
				// no pseudo-headers, x-epp-host/x-epp-port; the whole body in one
				// message with end_of_stream; then it closes. No response phase.
				g := ts.open(t, fmt.Sprintf("%s.%s:9002", poolSvc(5), poolNS(5)), nil)
				g.send(reqHeaders([]hdr{{"content-type", "application/json", false}, {"x-epp-host", poolSvc(5) + "." + poolNS(5), false}, {"x-epp-port", "9002", false}}, false))
				g.send(reqBody(completionBody("m", 10), true))
				hr := g.recv()
				dest := destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation())
				eps := checkPool(t, f, dest, 5)
				g.recv() // the body answer
				g.expectEOF()
				if eps[0].InFlight() != 0 {
					t.Fatal("in-flight left behind after a stream with no response phase")
				}
			})

			t.Run("header-only GET", func(t *testing.T) {
				g := ts.open(t, authorityOf(1), nil)
				g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
				hr := g.recv()
				checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 1)
				g.send(respHeaders([]hdr{{":status", "200", true}}, true, ""))
				g.recv()
				g.expectEOF()
			})

			t.Run("request trailers", func(t *testing.T) {
				// Full duplex with request trailers: the body ends in trailers, not
				// in an end_of_stream chunk.
				g := ts.open(t, authorityOf(6), nil)
				body := completionBody("m", 50)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
				g.send(reqBody(body[:20], false))
				g.send(reqBody(body[20:], false))
				g.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: headerMap([]hdr{{"x-t", "1", true}})}}})
				hr := g.recv()
				checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 6)
				for i := 0; i < 2; i++ {
					if r := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); r == nil || r.GetEndOfStream() {
						t.Fatalf("chunk %d answer %v", i, r)
					}
				}
				if g.recv().GetRequestTrailers() == nil {
					t.Fatal("trailers not answered")
				}
				g.expectEOF()
			})

			t.Run("no protocol_config, gateway waits for headers answer", func(t *testing.T) {
				// An older gateway in BUFFERED mode that sends no protocol_config.
				g := ts.open(t, authorityOf(0), nil)
				g.send(reqHeaders(envoyHeaders("POST", "/v1/completions"), false))
				if hr := g.recvWithin(2 * time.Second); hr.GetRequestHeaders() == nil {
					t.Fatalf("headers not answered: %v", hr)
				}
				g.send(reqBody(completionBody("m", 1), true))
				br := g.recv()
				checkPool(t, f, destination(t, br, br.GetRequestBody().GetResponse().GetHeaderMutation()), 0)
				g.expectEOF()
			})

			t.Run("model rewrite", func(t *testing.T) {
				g := ts.open(t, authorityOf(3), nil)
				body := []byte(`{"prompt":"p","model":"alias","z":{"model":"keep"}}`)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{"content-length", strconv.Itoa(len(body)), true}), false), duplex, duplex))
				g.send(reqBody(body[:10], false))
				g.send(reqBody(body[10:], true))
				hr := g.recv()
				hm := hr.GetRequestHeaders().GetResponse().GetHeaderMutation()
				checkPool(t, f, destination(t, hr, hm), 3)
				want := `{"prompt":"p","model":"real-model-v2","z":{"model":"keep"}}`
				if cl, _ := mutationHeader(hm, "content-length"); cl != strconv.Itoa(len(want)) {
					t.Errorf("content-length %q, want %d", cl, len(want))
				}
				var got []byte
				for i := 0; i < 2; i++ {
					got = append(got, g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
				}
				if string(got) != want {
					t.Fatalf("rewritten body %s, want %s", got, want)
				}
				g.expectEOF()
			})
			if n := f.totalInFlight(); n != 0 {
				t.Fatalf("in-flight total %d after all streams", n)
			}
		})
	}
}

func TestAuthorityForms(t *testing.T) {
	f := newPools(t, 20, 2)
	// Two pools sharing one picker Service on different ports.
	f.add(20, "shared", "pool-a", "epp-shared", 9002, 2)
	f.add(21, "shared", "pool-b", "epp-shared", 9003, 2)
	// A pool whose name has dots, addressed by Kubvernor by name.
	f.add(22, "kv", "my.pool", "epp-kv", 9002, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	cases := []struct {
		name, authority string
		want            int
	}{
		{"istio", "outbound|9002||epp-7.ns-2.svc.cluster.local", 7},
		{"kgateway", "epp-8.ns-3.svc:9002", 8},
		{"agentgateway", "epp-9.ns-4.svc.cluster.local:9002", 9},
		{"agentgateway other domain", "epp-9.ns-4.svc.corp.internal:9002", 9},
		{"ngf", "epp-11.ns-1:9002", 11},
		{"kubvernor", "route-a_route-extsvc-kv.my.pool", 22},
		{"no port", "epp-12.ns-2.svc.cluster.local", 12},
		{"target port instead of service port", "epp-13.ns-3.svc:8443", 13},
		{"same service port 9002", "epp-shared.shared.svc:9002", 20},
		{"same service port 9003", "outbound|9003||epp-shared.shared.svc.cluster.local", 21},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := ts.open(t, c.authority, nil)
			g.send(reqHeaders(envoyHeaders("GET", "/v1/models"), true))
			hr := g.recv()
			if hr.GetImmediateResponse() != nil {
				t.Fatalf("refused: %s", hr.GetImmediateResponse().GetBody())
			}
			checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), c.want)
			g.expectEOF()
		})
	}
}

func TestParseAuthority(t *testing.T) {
	cases := []struct {
		in   string
		want authorityRef
		ok   bool
	}{
		{"outbound|9002||epp.ns.svc.cluster.local", authorityRef{Namespace: "ns", Service: "epp", Port: 9002}, true},
		{"epp.ns.svc:9002", authorityRef{Namespace: "ns", Service: "epp", Port: 9002}, true},
		{"epp.ns.svc.cluster.local:80", authorityRef{Namespace: "ns", Service: "epp", Port: 80}, true},
		{"epp.ns:9002", authorityRef{Namespace: "ns", Service: "epp", Port: 9002}, true},
		{"r_route-extsvc-ns.pool", authorityRef{Pool: datastore.PoolKey{Namespace: "ns", Name: "pool"}}, true},
		{"10.0.0.1:9002", authorityRef{}, false},
		{"[::1]:9002", authorityRef{}, false},
		{"epp:9002", authorityRef{}, false},
		{"epp.ns.notsvc.x:9002", authorityRef{}, false},
		{"epp.ns:99999", authorityRef{}, false},
		{"outbound|x||epp.ns.svc.cluster.local", authorityRef{}, false},
		{"", authorityRef{}, false},
		{"r_route-extsvc-nodot", authorityRef{}, false},
	}
	for _, c := range cases {
		got, ok := parseAuthority(c.in)
		if ok != c.ok || got != c.want {
			t.Errorf("parseAuthority(%q) = %+v, %v; want %+v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func tagMD(ns, value string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: {Fields: map[string]*structpb.Value{hdrPoolTag: structpb.NewStringValue(value)}}}}
}

func TestPoolTags(t *testing.T) {
	f := newPools(t, 10, 2)
	f.add(10, "dup", "pool-x", "epp-dup", 9002, 2)
	f.add(11, "dup", "pool-y", "epp-dup", 9002, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	trusted := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, TrustPoolHeader: true})
	type tc struct {
		name      string
		srv       *testServer
		authority string
		md        metadata.MD
		mc        *corev3.Metadata
		attrs     map[string]*structpb.Struct
		headers   []hdr
		want      int // pool index, or -code for an error
		wantMsg   string
	}
	subsetY := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{
		MetadataKeySubset: structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("127.0.12.2:8000")}})}}}}
	cases := []tc{
		{name: "grpc metadata tag beats authority", srv: ts, authority: authorityOf(1), md: metadata.Pairs(hdrPoolTag, "ns-3/pool-3"), want: 3},
		{name: "metadata_context tag", srv: ts, mc: tagMD("poolpicker", "ns-4/pool-4"), want: 4},
		{name: "attributes tag", srv: ts, attrs: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{hdrPoolTag: structpb.NewStringValue("ns-0/pool-5")}}}, want: 5},
		{name: "agreeing tags", srv: ts, md: metadata.Pairs(hdrPoolTag, "ns-1/pool-6"), mc: tagMD("a", "ns-1/pool-6"), want: 6},
		{name: "ambiguous tags", srv: ts, md: metadata.Pairs(hdrPoolTag, "ns-1/pool-6"), mc: tagMD("a", "ns-2/pool-7"), want: -503, wantMsg: "ambiguous pool tag"},
		{name: "unknown tag", srv: ts, md: metadata.Pairs(hdrPoolTag, "ns-1/nope"), want: -404, wantMsg: "ns-1/nope"},
		{name: "malformed tag", srv: ts, md: metadata.Pairs(hdrPoolTag, "nope"), want: -503, wantMsg: "malformed"},
		{name: "authority shared by two pools", srv: ts, authority: "epp-dup.dup.svc:9002", want: -503, wantMsg: "matches 2 pools"},
		{name: "subset hint disambiguates", srv: ts, authority: "epp-dup.dup.svc:9002", mc: subsetY, want: 11},
		{name: "subset hint alone", srv: ts, mc: subsetY, want: 11},
		{name: "untrusted header ignored", srv: ts, headers: []hdr{{hdrPoolTag, "ns-2/pool-2", true}}, want: -503, wantMsg: "cannot tell"},
		{name: "trusted header", srv: trusted, headers: []hdr{{hdrPoolTag, "ns-2/pool-2", true}}, want: 2},
		{name: "trusted header unknown pool", srv: trusted, headers: []hdr{{hdrPoolTag, "ns-2/zzz", true}}, want: -404},
		{name: "unresolvable names what it saw", srv: ts, authority: "other.place.svc:1234", want: -503, wantMsg: `other.place.svc:1234`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := c.srv.open(t, c.authority, c.md)
			m := reqHeaders(envoyHeaders("GET", "/v1/models", c.headers...), true)
			m.MetadataContext, m.Attributes = c.mc, c.attrs
			g.send(m)
			r := g.recv()
			if c.want < 0 {
				code, body := immediateCode(t, r)
				if code != -c.want || !strings.Contains(body, c.wantMsg) {
					t.Fatalf("got %d %s, want %d containing %q", code, body, -c.want, c.wantMsg)
				}
				return
			}
			checkPool(t, f, destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()), c.want)
		})
	}

	t.Run("single pool needs no tag", func(t *testing.T) {
		one := newPools(t, 1, 2)
		s := startServer(t, one.reg, leastInFlight{}, Options{Insecure: true})
		g := s.open(t, "10.1.2.3:9002", nil)
		g.send(reqHeaders(envoyHeaders("GET", "/v1/models"), true))
		r := g.recv()
		checkPool(t, one, destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
	})
}

// errorBodyOf decodes an immediate response body, checking its shape.
func errorBodyOf(t *testing.T, body string) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error.Message == "" || eb.Error.Type == "" {
		t.Fatalf("not an OpenAI-style error body: %s (%v)", body, err)
	}
	return eb
}

func TestErrorStatuses(t *testing.T) {
	f := newPools(t, 3, 2)
	f.pools[1].SetPods(nil) // no endpoints
	f.pools[2].SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1}})
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxRequestBodyBytes: 1024})
	cases := []struct {
		name      string
		authority string
		md        metadata.MD
		path      string
		extra     []hdr
		body      []byte
		chunks    int
		want      int
	}{
		{"bad json", authorityOf(0), nil, "/v1/completions", nil, []byte(`{"model":"m",`), 1, 400},
		{"not an object", authorityOf(0), nil, "/v1/chat/completions", nil, []byte(`[1]`), 1, 400},
		{"missing model", authorityOf(0), nil, "/v1/chat/completions", nil, []byte(`{"messages":[]}`), 1, 400},
		{"model not a string", authorityOf(0), nil, "/v1/embeddings", nil, []byte(`{"model":3}`), 1, 400},
		{"too large", authorityOf(0), nil, "/v1/completions", nil, completionBody("m", 2000), 4, 413},
		{"unknown pool tag", authorityOf(0), metadata.Pairs(hdrPoolTag, "ns-0/ghost"), "/v1/completions", nil, completionBody("m", 1), 1, 404},
		{"shed", authorityOf(2), nil, "/v1/completions", []hdr{{hdrObjective, "batch", true}}, completionBody("m", 1), 1, 429},
		{"shed, deprecated objective header", authorityOf(2), nil, "/v1/completions", []hdr{{hdrObjectiveDeprecated, "batch", false}}, completionBody("m", 1), 1, 429},
		{"shed, current objective header wins", authorityOf(2), nil, "/v1/completions", []hdr{{hdrObjective, "batch", true}, {hdrObjectiveDeprecated, "other", true}}, completionBody("m", 1), 1, 429},
		{"no endpoint", authorityOf(1), nil, "/v1/completions", nil, completionBody("m", 1), 1, 503},
		{"unresolvable pool", "x.y.svc:1", nil, "/v1/completions", nil, completionBody("m", 1), 1, 503},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := metricSum(ts.srv.metrics.errors)
			g := ts.open(t, c.authority, c.md)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", c.path, c.extra...), false), duplex, duplex))
			var r *extprocv3.ProcessingResponse
			for i, ch := range splitChunks(c.body, c.chunks) {
				if err := g.stream.Send(reqBody(ch, i == c.chunks-1)); err != nil {
					break // the server may already have answered and closed
				}
			}
			r = g.recv()
			code, body := immediateCode(t, r)
			if code != c.want {
				t.Fatalf("status %d (%s), want %d", code, body, c.want)
			}
			eb := errorBodyOf(t, body)
			if eb.Error.Code != c.want {
				t.Errorf("body code %d", eb.Error.Code)
			}
			if got := metricSum(ts.srv.metrics.errors) - before; got != 1 {
				t.Errorf("error counter moved by %v", got)
			}
		})
	}
	if n := f.totalInFlight(); n != 0 {
		t.Fatalf("in-flight %d after refusals", n)
	}
}

// TestBadBodyAnsweredEarly: a body is read as it arrives, so a defect in
// its first chunk is answered 400 at once, before the gateway has sent the
// rest (which cannot mend it); a body that is merely incomplete waits.
func TestBadBodyAnsweredEarly(t *testing.T) {
	f := newPools(t, 1, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	cases := []struct {
		name, path, first string
		want              string
	}{
		{"model not a string", "/v1/chat/completions", `{"model":7,"messages":[{"role":"user","content":"hello`, `must be a string`},
		{"messages not an array", "/v1/chat/completions", `{"model":"m","messages":{"role":"user","content":"hello`, `must be an array`},
		{"not an object", "/v1/completions", `["model","m","prompt","hello`, "not a JSON object"},
		{"bad escape before the prompt", "/v1/completions", `{"user":"a\qb","model":"m","prompt":"hello`, "bad escape"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := ts.open(t, authorityOf(0), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", c.path), false), duplex, duplex))
			g.send(reqBody([]byte(c.first), false))
			code, body := immediateCode(t, g.recv())
			if code != 400 || !strings.Contains(body, c.want) {
				t.Fatalf("answered %d %s, want 400 saying %q", code, body, c.want)
			}
		})
	}
	t.Run("incomplete but sound", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), duplex, duplex))
		g.send(reqBody([]byte(`{"model":"m","messages":[{"role":"user","content":"hel`), false))
		g.send(reqBody([]byte(`lo"}]}`), true))
		r := g.recv()
		destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		g.recv()
		g.recv()
		g.expectEOF()
	})
	if n := f.totalInFlight(); n != 0 {
		t.Fatalf("in-flight %d", n)
	}
}

// TestConcurrentStreams runs 1,000 full-duplex streams across 50 pools at
// once and checks that every pick belongs to the stream's own pool.
func TestConcurrentStreams(t *testing.T) {
	const pools, streams = 50, 1000
	f := newPools(t, pools, 4)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	start := make(chan struct{})
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			p := i % pools
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			<-start
			s, err := extprocv3.NewExternalProcessorClient(ts.conn(t, authorityOf(p))).Process(ctx)
			if err != nil {
				errs <- err
				return
			}
			body := completionBody(fmt.Sprintf("model-%d", i%7), i%500)
			msgs := []*extprocv3.ProcessingRequest{withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)}
			for j, c := range splitChunks(body, 2) {
				msgs = append(msgs, reqBody(c, j == 1))
			}
			for _, m := range msgs {
				if err := s.Send(m); err != nil {
					errs <- err
					return
				}
			}
			hr, err := s.Recv()
			if err != nil {
				errs <- err
				return
			}
			dest, _ := mutationHeader(hr.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
			for _, a := range strings.Split(dest, ",") {
				if _, ok := f.pools[p].Endpoints().Get(a); !ok {
					errs <- fmt.Errorf("stream for pool %d got %q", p, dest)
					return
				}
			}
			for j := 0; j < 2; j++ {
				if _, err := s.Recv(); err != nil {
					errs <- err
					return
				}
			}
			_ = s.Send(respHeaders([]hdr{{":status", "200", true}}, false, ""))
			_, _ = s.Recv()
			_ = s.Send(respBody([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`), true))
			_, _ = s.Recv()
			_ = s.CloseSend()
			if _, err := s.Recv(); err == nil {
				errs <- fmt.Errorf("stream %d: want EOF", i)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.totalInFlight(); n != 0 {
		t.Fatalf("in-flight %d after all streams", n)
	}
	if got := metricSum(ts.srv.metrics.requests); got != streams {
		t.Fatalf("request counter %v, want %d", got, streams)
	}
}

func TestCancellation(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	for _, at := range []string{"mid-body", "after-decision", "mid-response"} {
		t.Run(at, func(t *testing.T) {
			g := ts.open(t, authorityOf(1), nil)
			body := completionBody("m", 100)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
			if at == "mid-body" {
				g.send(reqBody(body[:10], false))
			} else {
				g.send(reqBody(body, true))
				g.recv()
				g.recv()
				if f.totalInFlight() != 1 {
					t.Fatalf("in-flight %d after decision", f.totalInFlight())
				}
				if at == "mid-response" {
					g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", "text/event-stream", true}}, false, ""))
					g.recv()
					g.send(respBody([]byte("data: {\"choices\":[]}\n\n"), false))
					g.recv()
				}
			}
			g.cancel()
			// The server finishes accounting after a client cancel on its
			// own goroutine, with no event the test can wait on.
			eventually(t, "in-flight counts back to 0", func() bool { return f.totalInFlight() == 0 })
		})
	}
}
