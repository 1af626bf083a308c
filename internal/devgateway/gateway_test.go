// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/modelsim"
)

const model = modelsim.DefaultModel

func completion(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"prompt":"hello there","max_tokens":5,"stream":%v}`, model, stream)
}

func addrsOf(sims []*modelsim.Server) []string {
	var out []string
	for _, s := range sims {
		out = append(out, s.Addr())
	}
	return out
}

func totalInFlight(reg *datastore.Registry) int64 {
	var n int64
	for _, p := range reg.Pools() {
		for _, e := range p.Endpoints().Endpoints {
			n += e.InFlight()
		}
	}
	return n
}

// Two pools behind one picker, told apart by the :authority of their
// endpointPickerRef Services; JSON and SSE responses come back through the
// picker, which sees the served endpoint (echoed by its conformance header).
func TestRoutesThroughPicker(t *testing.T) {
	ns := env.Namespace(t, "gw")
	simsA, portA := simGroup(t, 2, fastSim)
	simsB, portB := simGroup(t, 2, fastSim)
	reg := datastore.NewRegistry()
	addPool(reg, ns, "pool-a", "epp-a", 9002, simsA)
	addPool(reg, ns, "pool-b", "epp-b", 9002, simsB)
	p := startPicker(t, "", reg)
	createPool(t, ns, "pool-a", "epp-a", 9002, portA, "")
	createPool(t, ns, "pool-b", "epp-b", 9002, portB, "")
	createRoute(t, ns, "r", headerRule("x-pool", "b", "pool-b"), gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool-a", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: p.addr})
	c := newClient(t)

	tests := []struct {
		name     string
		hdr      map[string]string
		stream   bool
		wantPool string
		wantSims []string
	}{
		{"json to a", nil, false, ns + "/pool-a", addrsOf(simsA)},
		{"sse to a", nil, true, ns + "/pool-a", addrsOf(simsA)},
		{"json to b", map[string]string{"x-pool": "b"}, false, ns + "/pool-b", addrsOf(simsB)},
		{"sse to b", map[string]string{"x-pool": "b"}, true, ns + "/pool-b", addrsOf(simsB)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 4; i++ {
				r := do(t, c, g, "/v1/completions", completion(tt.stream), tt.hdr)
				if r.code != 200 {
					t.Fatalf("status %d: %s", r.code, r.body)
				}
				served := r.header.Get(modelsim.HeaderServer)
				if !slices.Contains(tt.wantSims, served) || r.header.Get(HeaderServedEndpoint) != served {
					t.Fatalf("served by %s (gateway says %s), want one of %v", served, r.header.Get(HeaderServedEndpoint), tt.wantSims)
				}
				if got := r.header.Get(HeaderPool); got != tt.wantPool {
					t.Fatalf("pool %s, want %s", got, tt.wantPool)
				}
				// The picker echoes the endpoint the gateway reported in
				// metadata_context envoy.lb, via a response header mutation.
				if got := r.header.Get("x-conformance-test-served-endpoint"); got != served {
					t.Fatalf("picker saw served endpoint %q, want %q", got, served)
				}
				if tt.stream {
					if !strings.HasSuffix(r.body, "data: [DONE]\n\n") || !strings.Contains(r.body, `"usage"`) {
						t.Fatalf("SSE body not relayed whole: %q", r.body)
					}
				} else {
					var resp struct {
						Usage struct {
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
					}
					if err := json.Unmarshal([]byte(r.body), &resp); err != nil || resp.Usage.CompletionTokens != 5 {
						t.Fatalf("body %q: %v", r.body, err)
					}
				}
			}
		})
	}
	// GET /v1/models has no body: the headers alone are decided.
	r := do(t, c, g, "/v1/models", "", nil)
	if r.code != 200 || !strings.Contains(r.body, model) {
		t.Fatalf("GET /v1/models: %d %s", r.code, r.body)
	}
	eventually(t, "in-flight counts back to zero", func() bool { return totalInFlight(reg) == 0 })
	if st := g.Stats(); st.ByStatus[200] != 17 || st.ResponsePhaseLost != 0 || st.DestinationMismatches != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The picker's ImmediateResponses (bad body, no endpoint) and the gateway's
// own errors reach the client with their status and JSON body.
func TestErrors(t *testing.T) {
	ns := env.Namespace(t, "gw")
	sims, port := simGroup(t, 1, fastSim)
	reg := datastore.NewRegistry()
	addPool(reg, ns, "pool", "epp", 9002, sims)
	addPool(reg, ns, "empty", "epp-empty", 9002, nil)
	p := startPicker(t, "", reg)
	createPool(t, ns, "pool", "epp", 9002, port, "")
	createPool(t, ns, "empty", "epp-empty", 9002, port, "")
	toEmpty := headerRule("x-pool", "empty", "empty")
	toEmpty.Matches[0].Path = &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchPathPrefix), Value: ptr.To("/v1")}
	createRoute(t, ns, "r", toEmpty, gwv1.HTTPRouteRule{Matches: prefix("/v1"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: p.addr, MaxRequestBodyBytes: 1 << 20})
	c := newClient(t)
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		wantCode         int
		wantMsg          string
	}{
		{"malformed JSON", "/v1/completions", `{"model":`, nil, 400, ""},
		{"no model", "/v1/completions", `{"prompt":"x"}`, nil, 400, "model"},
		{"no endpoint", "/v1/completions", completion(false), map[string]string{"x-pool": "empty"}, 503, ""},
		{"no route", "/other", "", nil, 404, "no HTTPRoute matches GET /other"},
		{"body over the gateway limit", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 1<<20) + `"}`, nil, 413, "larger than the gateway's"},
		{"unknown model at the server", "/v1/completions", `{"model":"nope","prompt":"x"}`, nil, 404, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, c, g, tt.path, tt.body, tt.hdr)
			if r.code != tt.wantCode {
				t.Fatalf("status %d, want %d: %s", r.code, tt.wantCode, r.body)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Code != tt.wantCode || !strings.Contains(e.Error.Message, tt.wantMsg) {
				t.Fatalf("error body %q (%v), want code %d and %q", r.body, err, tt.wantCode, tt.wantMsg)
			}
		})
	}
	if st := g.Stats(); st.ImmediateResponses != 3 {
		t.Fatalf("%d immediate responses, want 3 (two bad bodies, no endpoint)", st.ImmediateResponses)
	}
}

// A dead primary endpoint: the gateway moves on to the next one and reports
// that one as served; a header/metadata disagreement is counted.
func TestFallbackAndServedMetadata(t *testing.T) {
	ns := env.Namespace(t, "gw")
	sims, port := simGroup(t, 1, fastSim)
	dead := net.JoinHostPort("127.0.39.250", fmt.Sprint(port))
	f := &fixedPicker{dest: dead + "," + sims[0].Addr(), meta: dead + "," + sims[0].Addr()}
	addr := startFixedPicker(t, f)
	createPool(t, ns, "pool", "epp", 9002, port, "")
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: addr, EPPPlaintext: true, ConnectTimeout: 500 * time.Millisecond})
	c := newClient(t)
	for _, stream := range []bool{false, true} {
		r := do(t, c, g, "/v1/completions", completion(stream), nil)
		if r.code != 200 || r.header.Get(modelsim.HeaderServer) != sims[0].Addr() {
			t.Fatalf("status %d from %s: %s", r.code, r.header.Get(modelsim.HeaderServer), r.body)
		}
	}
	f.mu.Lock()
	served, auth := slices.Clone(f.served), slices.Clone(f.authority)
	f.mu.Unlock()
	if len(served) != 2 || served[0] != sims[0].Addr() || served[1] != sims[0].Addr() {
		t.Fatalf("served metadata %v, want the fallback %s twice", served, sims[0].Addr())
	}
	if want := "epp." + ns + ".svc:9002"; len(auth) != 2 || auth[0] != want {
		t.Fatalf(":authority %v, want %s (kgateway form)", auth, want)
	}
	if st := g.Stats(); st.Fallbacks != 2 || st.DestinationMismatches != 0 {
		t.Fatalf("stats %+v", st)
	}
	f.meta = sims[0].Addr()
	if r := do(t, c, g, "/v1/completions", completion(false), nil); r.code != 200 {
		t.Fatalf("status %d", r.code)
	}
	if st := g.Stats(); st.DestinationMismatches != 1 {
		t.Fatalf("mismatch not counted: %+v", st)
	}
}

// The picker is down when requests arrive: they wait and are served once it
// is up; the outage is reported. With a short window they give up with 503.
func TestPickerRetryWindow(t *testing.T) {
	ns := env.Namespace(t, "gw")
	sims, port := simGroup(t, 1, fastSim)
	reg := datastore.NewRegistry()
	addPool(reg, ns, "pool", "epp", 9002, sims)
	createPool(t, ns, "pool", "epp", 9002, port, "")
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	// Reserve an address for the picker, then free it: nothing listens yet.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pickerAddr := l.Addr().String()
	l.Close()

	g := startGateway(t, ns, Options{EPPAddress: pickerAddr, ExtProcRetryWindow: 20 * time.Second})
	c := newClient(t)
	results := make(chan result, 3)
	for i := 0; i < 3; i++ {
		go func() { results <- do(t, c, g, "/v1/completions", completion(i == 1), nil) }()
	}
	eventually(t, "requests held", func() bool { return g.Stats().ExtProcRetried == 3 })
	startPicker(t, pickerAddr, reg)
	for i := 0; i < 3; i++ {
		r := <-results
		if r.code != 200 || r.header.Get(HeaderExtProcAttempts) == "" {
			t.Fatalf("held request: %d attempts=%q %s", r.code, r.header.Get(HeaderExtProcAttempts), r.body)
		}
	}
	st := g.Stats()
	if len(st.Outages) != 1 || st.Outages[0].End.IsZero() || st.Outages[0].Retried != 3 || st.Outages[0].GaveUp != 0 || st.Outages[0].EPP != pickerAddr {
		t.Fatalf("outages %+v", st.Outages)
	}
	if st.ExtProcGaveUp != 0 {
		t.Fatalf("stats %+v", st)
	}

	short := startGateway(t, ns, Options{EPPAddress: "127.0.0.1:1", ExtProcRetryWindow: 200 * time.Millisecond})
	r := do(t, c, short, "/v1/completions", completion(false), nil)
	if r.code != 503 || !strings.Contains(r.body, "endpoint picker epp."+ns+".svc:9002 (127.0.0.1:1) unavailable") {
		t.Fatalf("status %d: %s", r.code, r.body)
	}
	if st := short.Stats(); st.ExtProcGaveUp != 1 || len(st.Outages) != 1 || st.Outages[0].GaveUp != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// With the picker's health address, requests wait while the picker is not
// Ready (here: it serves no pool yet) instead of reaching it, as a Service
// routes only to Ready pods; they go through once it is.
func TestWaitsForPickerReadiness(t *testing.T) {
	ns := env.Namespace(t, "gw")
	sims, port := simGroup(t, 1, fastSim)
	reg := datastore.NewRegistry()
	p := startPicker(t, "", reg)
	createPool(t, ns, "pool", "epp", 9002, port, "")
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: p.addr, EPPHealthAddress: p.healthAddr})
	res := make(chan result, 1)
	go func() { res <- do(t, newClient(t), g, "/v1/completions", completion(false), nil) }()
	eventually(t, "request held", func() bool { return g.Stats().ExtProcRetried == 1 })
	addPool(reg, ns, "pool", "epp", 9002, sims)
	r := <-res
	if r.code != 200 || r.header.Get(HeaderExtProcAttempts) == "" {
		t.Fatalf("held request: %d attempts=%q %s", r.code, r.header.Get(HeaderExtProcAttempts), r.body)
	}
	if st := g.Stats(); st.ImmediateResponses != 0 || len(st.Outages) != 1 || st.Outages[0].End.IsZero() {
		t.Fatalf("stats %+v: the unready picker must not have been asked", st)
	}
}

// A FailOpen pool whose picker is down is served by any ready pod.
func TestFailOpen(t *testing.T) {
	ns := env.Namespace(t, "gw")
	sims, port := simGroup(t, 1, fastSim)
	createPool(t, ns, "pool", "epp", 9002, port, v1.EndpointPickerFailOpen)
	host, _, _ := net.SplitHostPort(sims[0].Addr())
	createReadyPod(t, ns, "pod-0", "pool", host)
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: "127.0.0.1:1", ExtProcRetryWindow: -1})
	r := do(t, newClient(t), g, "/v1/completions", completion(false), nil)
	if r.code != 200 || r.header.Get(modelsim.HeaderServer) != sims[0].Addr() {
		t.Fatalf("status %d: %s", r.code, r.body)
	}
}

// Route changes apply without a restart.
func TestRouteUpdates(t *testing.T) {
	ns := env.Namespace(t, "gw")
	simsA, portA := simGroup(t, 1, fastSim)
	simsB, portB := simGroup(t, 1, fastSim)
	reg := datastore.NewRegistry()
	addPool(reg, ns, "pool-a", "epp-a", 9002, simsA)
	addPool(reg, ns, "pool-b", "epp-b", 9002, simsB)
	p := startPicker(t, "", reg)
	createPool(t, ns, "pool-a", "epp-a", 9002, portA, "")
	createPool(t, ns, "pool-b", "epp-b", 9002, portB, "")
	g := startGateway(t, ns, Options{EPPAddress: p.addr})
	c := newClient(t)
	if r := do(t, c, g, "/v1/completions", completion(false), nil); r.code != 404 {
		t.Fatalf("before any route: %d", r.code)
	}
	route := createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool-a", 1)}})
	eventually(t, "route to a", func() bool {
		return do(t, c, g, "/v1/completions", completion(false), nil).header.Get(modelsim.HeaderServer) == simsA[0].Addr()
	})
	// Routes of other Gateways are not ours: this one would catch /mine.
	other := &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "someone-else"}}},
			Rules:           []gwv1.HTTPRouteRule{{Matches: prefix("/mine"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool-a", 1)}}},
		},
	}
	if err := env.Client.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	route.Spec.Rules[0].BackendRefs = []gwv1.HTTPBackendRef{poolRef("pool-b", 1)}
	if err := env.Client.Update(context.Background(), route); err != nil {
		t.Fatal(err)
	}
	// Once the later update shows, the other route has been seen too.
	eventually(t, "route to b", func() bool {
		return do(t, c, g, "/v1/completions", completion(false), nil).header.Get(modelsim.HeaderServer) == simsB[0].Addr()
	})
	if r := do(t, c, g, "/mine", completion(false), nil); r.header.Get(HeaderPool) != ns+"/pool-b" {
		t.Fatalf("another Gateway's route was used: %v", r.header)
	}
}

// A client that goes away mid-stream cancels the ext_proc stream: the
// picker's in-flight count returns to zero.
func TestClientCancelMidStream(t *testing.T) {
	ns := env.Namespace(t, "gw")
	slow := fastSim
	slow.DecodePerToken = 10 * time.Millisecond
	sims, port := simGroup(t, 1, slow)
	reg := datastore.NewRegistry()
	addPool(reg, ns, "pool", "epp", 9002, sims)
	p := startPicker(t, "", reg)
	createPool(t, ns, "pool", "epp", 9002, port, "")
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{EPPAddress: p.addr})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+g.Addr()+"/v1/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":5000,"stream":true}`, model)))
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q: %v", line, err)
	}
	if totalInFlight(reg) != 1 {
		t.Fatalf("in flight %d while streaming, want 1", totalInFlight(reg))
	}
	cancel()
	resp.Body.Close()
	eventually(t, "in-flight back to zero", func() bool { return totalInFlight(reg) == 0 })
	eventually(t, "server request cancelled", func() bool { return sims[0].Stats().Cancelled == 1 })
}
