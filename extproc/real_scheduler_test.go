// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// newRealScheduler builds the project's scheduler with its default profile,
// registered as a registry observer before any pool exists.
func newRealScheduler(t testing.TB, reg *datastore.Registry) *scheduling.Scheduler {
	t.Helper()
	s, err := scheduling.New(nil, scheduling.Options{EnableConformanceTestFilter: true})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(s)
	return s
}

// TestRealScheduler drives the server with the real scheduler: concurrent
// streams across pools never cross pools, a subset hint and the
// conformance header narrow the pick, rewrites reach the body, shedding is 429.
func TestRealScheduler(t *testing.T) {
	reg := datastore.NewRegistry()
	sched := newRealScheduler(t, reg)
	f := &poolFixture{reg: reg}
	for i := 0; i < 20; i++ {
		f.add(i, poolNS(i), poolName(i), poolSvc(i), 9002, 4)
	}
	f.pools[3].SetPolicy(&datastore.Policy{
		Rewrites:   map[string][]datastore.RewriteTarget{"alias": {{Model: "base-v2", Weight: 100, Rewrite: "alias-to-v2"}}},
		Objectives: map[string]int{"batch": -1},
	})
	ts := startServer(t, reg, sched, Options{Insecure: true, EnableConformanceTestBehaviors: true})

	t.Run("concurrent streams stay in their pool", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				p := i % 20
				g := ts.open(t, authorityOf(p), nil)
				body := completionBody("m", i)
				if err := g.stream.Send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)); err != nil {
					errs <- err
					return
				}
				if err := g.stream.Send(reqBody(body, true)); err != nil {
					errs <- err
					return
				}
				hr, err := g.stream.Recv()
				if err != nil {
					errs <- err
					return
				}
				dest, _ := mutationHeader(hr.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
				for _, a := range strings.Split(dest, ",") {
					if _, ok := f.pools[p].Endpoints().Get(a); !ok {
						errs <- fmt.Errorf("pool %d got %q", p, dest)
					}
				}
				_, _ = g.stream.Recv()
				_ = g.stream.CloseSend()
				_, _ = g.stream.Recv()
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n := f.totalInFlight(); n != 0 {
			t.Fatalf("in-flight %d", n)
		}
	})

	t.Run("subset hint", func(t *testing.T) {
		g := ts.open(t, authorityOf(5), nil)
		m := reqHeaders(envoyHeaders("GET", "/v1/models"), true)
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{
			MetadataKeySubset: structpb.NewStringValue("127.0.6.4:8000")}}}}
		g.send(m)
		r := g.recv()
		if d := destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()); d != "127.0.6.4:8000" {
			t.Fatalf("subset hint ignored: %q", d)
		}
	})

	t.Run("conformance selection and echo", func(t *testing.T) {
		g := ts.open(t, authorityOf(7), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{HeaderConformanceSelection, "127.0.8.3, 127.0.8.5", true}), false), duplex, duplex))
		g.send(reqBody(completionBody("m", 1), true))
		r := g.recv()
		dest := destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		for _, a := range strings.Split(dest, ",") {
			if a != "127.0.8.3:8000" && a != "127.0.8.5:8000" {
				t.Fatalf("conformance selection ignored: %q", dest)
			}
		}
		g.recv()
		g.send(respHeaders([]hdr{{":status", "200", true}}, false, "127.0.8.5:8000"))
		rh := g.recv()
		if v, _ := mutationHeader(rh.GetResponseHeaders().GetResponse().GetHeaderMutation(), HeaderConformanceServed); v != "127.0.8.5:8000" {
			t.Fatalf("served endpoint echo %q", v)
		}
		g.send(respBody(nil, true))
		g.recv()
		g.expectEOF()
	})

	t.Run("conformance ip:port tokens; a gateway that reports no served endpoint shows", func(t *testing.T) {
		cases := []struct {
			header, want string
			code         int
		}{
			{"127.0.8.3:8000", "127.0.8.3:8000", 0},
			{"127.0.8.9, 127.0.8.5:8000", "127.0.8.5:8000", 0},
			{"127.0.8.3:9999", "", 503},
		}
		for _, c := range cases {
			g := ts.open(t, authorityOf(7), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{HeaderConformanceSelection, c.header, true}), false), duplex, duplex))
			g.send(reqBody(completionBody("m", 1), true))
			r := g.recv()
			if c.code != 0 {
				if code, msg := immediateCode(t, r); code != c.code {
					t.Fatalf("%q: answered %d %s, want %d", c.header, code, msg, c.code)
				}
				continue
			}
			if dest := destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()); dest != c.want {
				t.Fatalf("%q: picked %q, want %q", c.header, dest, c.want)
			}
			g.recv()
			g.send(respHeaders([]hdr{{":status", "200", true}}, false, "")) // no envoy.lb served metadata
			rh := g.recv()
			if v, _ := mutationHeader(rh.GetResponseHeaders().GetResponse().GetHeaderMutation(), HeaderConformanceServed); v != "fail: missing destination endpoint served metadata" {
				t.Fatalf("served echo without the gateway's report: %q", v)
			}
			g.send(respBody(nil, true))
			g.recv()
			g.expectEOF()
		}
	})

	t.Run("model rewrite header, current and deprecated name", func(t *testing.T) {
		cases := []struct {
			name    string
			headers []hdr
			want    string
		}{
			{"current name", []hdr{{hdrModelRewrite, "base-v3", true}}, `{"model":"base-v3","prompt":"x"}`},
			{"deprecated name", []hdr{{hdrModelRewriteDeprecated, "base-v3", false}}, `{"model":"base-v3","prompt":"x"}`},
			{"current name wins", []hdr{{hdrModelRewriteDeprecated, "old", true}, {hdrModelRewrite, "base-v4", true}}, `{"model":"base-v4","prompt":"x"}`},
			{"pool rules apply to the named model", []hdr{{hdrModelRewrite, "alias", true}}, `{"model":"base-v2","prompt":"x"}`},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				g := ts.open(t, authorityOf(3), nil)
				body := []byte(`{"model":"m","prompt":"x"}`)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", c.headers...), false), duplex, duplex))
				g.send(reqBody(body, true))
				r := g.recv()
				destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
				if b := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); string(b) != c.want {
					t.Fatalf("body %s, want %s", b, c.want)
				}
				g.expectEOF()
			})
		}
	})

	t.Run("rewrite and shed", func(t *testing.T) {
		decisions := ts.srv.metrics.rewrites.WithLabelValues("alias-to-v2", "alias", "base-v2", poolNS(3), poolName(3))
		before := testutil.ToFloat64(decisions)
		g := ts.open(t, authorityOf(3), nil)
		body := []byte(`{"model":"alias","prompt":"x"}`)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{"content-length", strconv.Itoa(len(body)), true}), false), duplex, duplex))
		g.send(reqBody(body, true))
		r := g.recv()
		destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		b := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
		if string(b) != `{"model":"base-v2","prompt":"x"}` {
			t.Fatalf("body %s", b)
		}
		g.expectEOF()
		if got := testutil.ToFloat64(decisions) - before; got != 1 {
			t.Errorf("inference_extension_model_rewrite_decisions_total rose by %v for the rewritten request, want 1", got)
		}

		// Saturate the pool: every endpoint's queue is deep and its KV cache full.
		for _, e := range f.pools[3].Endpoints().Endpoints {
			e.SetMetrics(&datastore.Metrics{WaitingRequests: 100, KVCacheUsage: 0.99, ScrapedAt: time.Now()})
		}
		g = ts.open(t, authorityOf(3), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{hdrObjective, "batch", true}), false), duplex, duplex))
		g.send(reqBody(body, true))
		if code, msg := immediateCode(t, g.recv()); code != 429 {
			t.Fatalf("sheddable request on a saturated pool answered %d %s", code, msg)
		}
	})
	// Subtests that leave a stream open cancel it as they end; the server
	// finishes its accounting on the stream's goroutine.
	eventually(t, "in-flight counts back to 0", func() bool { return f.totalInFlight() == 0 })
}

// promptRecorder is a scheduling plugin that reads only the first limit
// bytes of the prompt, records the prompts it is handed and counts the
// picks committed to it (PostPick).
type promptRecorder struct {
	limit   int
	mu      sync.Mutex
	prompts []string
	commits atomic.Int64
}

const promptRecorderType = "prompt-recorder"

func (r *promptRecorder) TypedName() framework.TypedName {
	return framework.TypedName{Type: promptRecorderType, Name: promptRecorderType}
}

func (r *promptRecorder) PromptBytes() int { return r.limit }

func (r *promptRecorder) Score(_ context.Context, _ *framework.CycleState, req *framework.Request, _ []framework.Candidate, _ []float64) *framework.Status {
	r.mu.Lock()
	r.prompts = append(r.prompts, string(req.Prompt))
	r.mu.Unlock()
	return nil
}

func (r *promptRecorder) PostPick(context.Context, *framework.CycleState, *framework.Request, *framework.Result) {
	r.commits.Add(1)
}

// newRecordingScheduler is a real scheduler whose one scorer is rec.
func newRecordingScheduler(t testing.TB, reg *datastore.Registry, rec *promptRecorder) *scheduling.Scheduler {
	return newPluginScheduler(t, reg, promptRecorderType, rec)
}

// newPluginScheduler is a real scheduler of reg's pools whose one plugin,
// of type typ, is p.
func newPluginScheduler(t testing.TB, reg *datastore.Registry, typ string, p framework.Plugin) *scheduling.Scheduler {
	t.Helper()
	plugins := scheduling.NewRegistry()
	if err := plugins.Register(typ, func(string, json.RawMessage, framework.Handle) (framework.Plugin, error) { return p, nil }); err != nil {
		t.Fatal(err)
	}
	s, err := scheduling.New(nil, scheduling.Options{Registry: plugins, ConfigText: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: " + typ + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(s)
	return s
}

// TestPromptBytesLimit: the server hands the scheduler only the prompt
// bytes it reads, forwards the whole body unchanged, and commits the pick.
func TestPromptBytesLimit(t *testing.T) {
	for _, limit := range []int{0, 10, 1 << 20} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			reg := datastore.NewRegistry()
			rec := &promptRecorder{limit: limit}
			sched := newRecordingScheduler(t, reg, rec)
			f := &poolFixture{reg: reg}
			for _, e := range f.add(0, poolNS(0), poolName(0), poolSvc(0), 9002, 2).Endpoints().Endpoints {
				e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
			}
			ts := startServer(t, f.reg, sched, Options{Insecure: true})
			content := strings.Repeat("long \\\"prompt\\\" ", 2000)
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + content + `"}]}`)
			g := ts.open(t, authorityOf(0), nil)
			if err := g.stream.Send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), duplex, duplex)); err != nil {
				t.Fatal(err)
			}
			half := len(body) / 2
			for i, part := range [][]byte{body[:half], body[half:]} {
				if err := g.stream.Send(reqBody(part, i == 1)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := g.stream.Recv(); err != nil {
				t.Fatal(err)
			}
			var back []byte
			for range 2 {
				r, err := g.stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				back = append(back, r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
			if string(back) != string(body) {
				t.Fatalf("forwarded body differs (%d bytes, want %d)", len(back), len(body))
			}
			// The messages' JSON as sent, cut at the limit.
			full := `[{"role":"user","content":"` + content + `"}]`
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if want := full[:min(limit, len(full))]; len(rec.prompts) != 1 || rec.prompts[0] != want {
				t.Fatalf("scheduler got prompts of %d bytes, want one of %d", len(rec.prompts[0]), len(want))
			}
			// The server runs the deferred part of the pick once it has answered.
			eventually(t, "the pick committed once", func() bool { return rec.commits.Load() == 1 })
		})
	}
}

// TestRealSchedulerLearnsPrefixes: bodies held in several chunks (joined in
// a reused buffer) are parsed, routed and forwarded intact, and the
// scheduler learns each pick after it is answered, so a conversation sticks
// to the endpoint that served it while a different one may go elsewhere.
func TestRealSchedulerLearnsPrefixes(t *testing.T) {
	reg := datastore.NewRegistry()
	sched := newRealScheduler(t, reg)
	f := &poolFixture{reg: reg}
	pool := f.add(0, poolNS(0), poolName(0), poolSvc(0), 9002, 4)
	for _, e := range pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{WaitingRequests: 0, KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
	}
	ts := startServer(t, reg, sched, Options{Insecure: true})

	chat := func(topic string) []byte {
		content := strings.Repeat("tell me about "+topic+" \\\"please\\\"\\n ", 400)
		return []byte(`{"model":"m","messages":[{"role":"user","content":"` + content + `"}],"stream":false}`)
	}
	route := func(body []byte) string {
		t.Helper()
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), duplex, duplex))
		const chunk = 4 << 10
		n := 0
		for off := 0; off < len(body); off += chunk {
			g.send(reqBody(body[off:min(off+chunk, len(body))], off+chunk >= len(body)))
			n++
		}
		r := g.recv()
		dest := destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		var back []byte
		for range n {
			back = append(back, g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		if string(back) != string(body) {
			t.Fatalf("forwarded body differs from the one sent (%d bytes, want %d)", len(back), len(body))
		}
		g.expectEOF()
		return strings.Split(dest, ",")[0]
	}
	a, b := chat("kv caches"), chat("prefix trees")
	first := route(a)
	for i := 0; i < 10; i++ {
		if got := route(a); got != first {
			t.Fatalf("repeat %d of a conversation went to %s, want %s, which served it first", i, got, first)
		}
		route(b) // a different body through the same reused buffers
	}
	if n := f.totalInFlight(); n != 0 {
		t.Fatalf("in-flight %d", n)
	}
}

// TestEmitEndpointScores: with EmitEndpointScores the decision's envoy.lb
// metadata carries x-gateway-destination-endpoint-scores, a number for
// every endpoint of the pool the real scheduler scored, the primary's the
// highest; without it the key is absent.
func TestEmitEndpointScores(t *testing.T) {
	for _, emit := range []bool{true, false} {
		t.Run(fmt.Sprintf("emit=%v", emit), func(t *testing.T) {
			reg := datastore.NewRegistry()
			sched := newRealScheduler(t, reg)
			f := &poolFixture{reg: reg}
			f.add(0, poolNS(0), poolName(0), poolSvc(0), 9002, 3)
			ts := startServer(t, reg, sched, Options{Insecure: true, EmitEndpointScores: emit})
			g := ts.open(t, authorityOf(0), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
			g.send(reqBody(completionBody("m", 1), true))
			r := g.recv()
			dest := destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
			lb := r.GetDynamicMetadata().GetFields()[MetadataNamespaceLB].GetStructValue()
			scores, present := lb.GetFields()[MetadataKeyScores]
			if !emit {
				if present {
					t.Fatalf("scores %v sent without EmitEndpointScores", scores)
				}
				return
			}
			fields := scores.GetStructValue().GetFields()
			if len(fields) != 3 {
				t.Fatalf("scores %v, want one for each of the pool's 3 endpoints", scores)
			}
			primary := strings.Split(dest, ",")[0]
			for addr, v := range fields {
				if _, ok := f.pools[0].Endpoints().Get(addr); !ok {
					t.Errorf("score for %s, not an endpoint of the pool", addr)
				}
				if _, ok := v.GetKind().(*structpb.Value_NumberValue); !ok {
					t.Errorf("score of %s is %v, not a number", addr, v)
				}
				if v.GetNumberValue() > fields[primary].GetNumberValue() {
					t.Errorf("%s scored %v, above the primary %s's %v", addr, v.GetNumberValue(), primary, fields[primary].GetNumberValue())
				}
			}
		})
	}
}

// TestSaturationAdmission: through the real server and scheduler, a
// sheddable request to a pool that is saturated on average, though one
// endpoint still has room, is answered 429 with the OpenAI-style body under
// the pool-average rule and routed under all-saturated; a request of
// priority 0 is routed under both.
func TestSaturationAdmission(t *testing.T) {
	for _, tc := range []struct {
		rule     string
		wantShed bool
	}{
		{scheduling.AdmissionPoolAverage, true},
		{scheduling.AdmissionAllSaturated, false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			reg := datastore.NewRegistry()
			sched, err := scheduling.New(nil, scheduling.Options{SaturationAdmission: tc.rule})
			if err != nil {
				t.Fatal(err)
			}
			reg.AddObserver(sched)
			f := &poolFixture{reg: reg}
			p := f.add(0, poolNS(0), poolName(0), poolSvc(0), 9002, 2)
			p.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1, "chat": 0}})
			// Loads max(8/5, 0.2/0.8) = 1.6 and max(1/5, 0.48/0.8) = 0.6:
			// a mean of 1.1, with the second endpoint below both thresholds.
			eps := p.Endpoints().Endpoints
			eps[0].SetMetrics(&datastore.Metrics{WaitingRequests: 8, KVCacheUsage: 0.2, ScrapedAt: time.Now()})
			eps[1].SetMetrics(&datastore.Metrics{WaitingRequests: 1, KVCacheUsage: 0.48, ScrapedAt: time.Now()})
			ts := startServer(t, reg, sched, Options{Insecure: true})

			send := func(objective string) *extprocv3.ProcessingResponse {
				g := ts.open(t, authorityOf(0), nil)
				g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{hdrObjective, objective, true}), false), duplex, duplex))
				g.send(reqBody(completionBody("m", 1), true))
				return g.recv()
			}
			r := send("batch")
			if tc.wantShed {
				code, body := immediateCode(t, r)
				var e errorBody
				if err := json.Unmarshal([]byte(body), &e); err != nil {
					t.Fatalf("429 body %q: %v", body, err)
				}
				if code != 429 || e.Error.Type != "rate_limit_error" || e.Error.Code != 429 || !strings.Contains(e.Error.Message, "mean load") {
					t.Fatalf("sheddable request answered %d %s, want 429 naming the pool's mean load", code, body)
				}
			} else {
				destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
			}
			r = send("chat")
			destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		})
	}
}

// reportRecorder is a post-pick plugin that predicts the primary
// endpoint's cache and hears the server's report of each response.
type reportRecorder struct{ heard chan heardReport }

type heardReport struct {
	p      framework.CachePrediction
	cached int
}

const reportRecorderType = "report-recorder"

func (r *reportRecorder) TypedName() framework.TypedName {
	return framework.TypedName{Type: reportRecorderType, Name: reportRecorderType}
}

func (r *reportRecorder) PostPick(_ context.Context, _ *framework.CycleState, _ *framework.Request, res *framework.Result) {
	res.Predict(framework.CachePrediction{Observer: r, PredictedTokens: 32})
}

func (r *reportRecorder) ObserveCachedTokens(p *framework.CachePrediction, cached int) {
	r.heard <- heardReport{*p, cached}
}

// TestResponseReportReachesThePrediction: the cached and prompt tokens a
// response's usage reports, and the time to the first byte of a streamed
// one, reach the post-pick plugin that predicted the primary endpoint's
// cache, through the real scheduler; a response not streamed reports no
// TTFT.
func TestResponseReportReachesThePrediction(t *testing.T) {
	reg := datastore.NewRegistry()
	rec := &reportRecorder{heard: make(chan heardReport, 1)}
	s := newPluginScheduler(t, reg, reportRecorderType, rec)
	f := &poolFixture{reg: reg}
	f.add(0, poolNS(0), poolName(0), poolSvc(0), 9002, 1)
	ts := startServer(t, f.reg, s, Options{Insecure: true})
	const firstGap = 30 * time.Millisecond
	for _, c := range []struct {
		contentType string
		chunks      []string
	}{
		{"text/event-stream", []string{"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n"}},
		{"application/json", []string{`{"choices":[{"text":"ab"}],"usage":{"prompt_tokens":40,`, `"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}`}},
	} {
		t.Run(c.contentType, func(t *testing.T) {
			start := time.Now()
			g := ts.open(t, authorityOf(0), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
			g.send(reqBody([]byte(`{"model":"m","prompt":"hi","stream":true}`), true))
			g.recv()
			g.recv()
			g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", c.contentType, true}}, false, ""))
			g.recv()
			// The model server's time to its first token: what is measured
			// is time passing, so the test lets it pass.
			time.Sleep(firstGap)
			for i, chunk := range c.chunks {
				g.send(respBody([]byte(chunk), i == len(c.chunks)-1))
				g.recv()
			}
			g.expectEOF()
			total := time.Since(start)
			h := <-rec.heard
			if h.cached != 32 || h.p.ReportedPromptTokens != 40 || h.p.PredictedTokens != 32 {
				t.Fatalf("heard %d cached of %d (predicted %d), want 32 of 40 (32)", h.cached, h.p.ReportedPromptTokens, h.p.PredictedTokens)
			}
			streamed := c.contentType == "text/event-stream"
			if got := h.p.ReportedTTFT; streamed && (got < firstGap || got > total) || !streamed && got != 0 {
				t.Fatalf("TTFT %v, want between %v and %v when streamed, else 0", got, firstGap, total)
			}
		})
	}
}
