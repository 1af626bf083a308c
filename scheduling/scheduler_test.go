// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
	"github.com/poolpicker/poolpicker/scheduling/plugins/load"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

var ctx = context.Background()

func addresses(res *Result) []string {
	var out []string
	for _, e := range res.Endpoints {
		out = append(out, e.Address)
	}
	return out
}

func wantAddresses(t *testing.T, res *Result, want ...*datastore.Endpoint) {
	t.Helper()
	got := addresses(res)
	if len(got) != len(want) {
		t.Fatalf("endpoints %v, want %d of them", got, len(want))
	}
	for i, e := range want {
		if got[i] != e.Address {
			t.Fatalf("endpoints %v, want %s at position %d", got, e.Address, i)
		}
	}
}

func schedErr(t *testing.T, err error) *Error {
	t.Helper()
	var se *Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T), want *scheduling.Error", err, err)
	}
	return se
}

func TestScheduleQueueAware(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	for i, q := range []int{6, 0, 3, 9} {
		tp.Ep(t, i+1).SetMetrics(schedtest.Load(q, 0.2))
	}
	res, err := s.Schedule(ctx, tp.Pool, &Request{ID: "r1", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	// Shortest queue first, then the next shortest: the fallbacks are ordered.
	wantAddresses(t, res, tp.Ep(t, 2), tp.Ep(t, 3), tp.Ep(t, 1))
	if res.Profile != DefaultProfileName {
		t.Fatalf("profile %q", res.Profile)
	}
}

func TestScheduleSpreadsByInFlight(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	// Between two scrapes the metrics do not move; only the in-flight count,
	// which extproc keeps, tells the picks apart.
	counts := map[string]int{}
	for i := 0; i < 40; i++ {
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		res.Endpoints[0].AddInFlight(1)
		counts[res.Endpoints[0].Address]++
	}
	if len(counts) != 4 {
		t.Fatalf("picks went to %d endpoints, want 4: %v", len(counts), counts)
	}
	for a, n := range counts {
		if n != 10 {
			t.Fatalf("endpoint %s got %d of 40 picks, want 10: %v", a, n, counts)
		}
	}
}

func TestScheduleAvoidsHighKVCache(t *testing.T) {
	// The default profile leaves KV-cache use out (it would push requests
	// away from the servers holding their prefixes); a profile can ask.
	s := mustScheduler(t, `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
`, Options{})
	tp := newTestPool(t, 3, s)
	for i, kv := range []float64{0.95, 0.1, 0.5} {
		tp.Ep(t, i+1).SetMetrics(schedtest.Load(1, kv))
	}
	for i := 0; i < 20; i++ {
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		wantAddresses(t, res, tp.Ep(t, 2), tp.Ep(t, 3), tp.Ep(t, 1))
	}
}

func TestScheduleLoRAAffinity(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	lora := func(running, waiting []string) *datastore.Metrics {
		m := schedtest.Load(1, 0.3)
		m.RunningAdapters, m.WaitingAdapters, m.MaxAdapters = running, waiting, 2
		return m
	}
	tp.Ep(t, 1).SetMetrics(lora([]string{"a", "b"}, nil))             // full, without the adapter
	tp.Ep(t, 2).SetMetrics(lora([]string{"a"}, []string{"sql-lora"})) // loading it, slot free
	tp.Ep(t, 3).SetMetrics(lora([]string{"sql-lora"}, nil))           // running it
	tp.Ep(t, 4).SetMetrics(lora(nil, nil))                            // free slots
	// The client asked for "sql"; the pool's rewrite (applied by the
	// request's life) sends it to the adapter, which plugins weigh.
	res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "sql", TargetModel: "sql-lora", ModelRewrite: "sql-to-lora"})
	if err != nil {
		t.Fatal(err)
	}
	wantAddresses(t, res, tp.Ep(t, 3), tp.Ep(t, 2), tp.Ep(t, 4))
	if d := s.RecentDecisions(tp.Pool); len(d) != 1 || d[0].TargetModel != "sql-lora" {
		t.Fatalf("decisions %+v, want one of target model sql-lora", d)
	}
}

func TestSchedulePrefixStickinessThenSpill(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(1, 0.3) })
	conversation := schedtest.Prompt("system prompt and history", 4096)

	serve := func(p []byte) *datastore.Endpoint {
		t.Helper()
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: p})
		if err != nil {
			t.Fatal(err)
		}
		// A request that is picked, served and finished.
		e := res.Endpoints[0]
		e.AddInFlight(1)
		e.AddInFlight(-1)
		return e
	}
	sticky := serve(conversation)
	for i := 0; i < 20; i++ {
		if got := serve(conversation); got != sticky {
			t.Fatalf("pick %d went to %s, want the endpoint holding the prefix, %s", i, got.Address, sticky.Address)
		}
	}
	// The next turn of the conversation shares its first 4 KB.
	next := append(append([]byte{}, conversation...), schedtest.Prompt("next turn", 1024)...)
	if got := serve(next); got != sticky {
		t.Fatalf("longer prompt went to %s, want %s", got.Address, sticky.Address)
	}
	// Moderate extra load does not break affinity...
	sticky.SetMetrics(schedtest.Load(3, 0.6))
	if got := serve(conversation); got != sticky {
		t.Fatalf("with a short queue the prompt went to %s, want %s", got.Address, sticky.Address)
	}
	// ...nor does a nearly full KV cache with a queue at the saturation
	// threshold: four more requests wait less than 1,024 tokens prefill...
	sticky.SetMetrics(schedtest.Load(DefaultQueueDepthThreshold, 0.95))
	if got := serve(conversation); got != sticky {
		t.Fatalf("with a full KV cache the prompt went to %s, want %s", got.Address, sticky.Address)
	}
	// ...a queue that costs more than the prefill does: the prompt spills,
	// and the new endpoint learns it.
	sticky.SetMetrics(schedtest.Load(12, 0.92))
	spill := serve(conversation)
	if spill == sticky {
		t.Fatalf("prompt stayed on saturated %s", sticky.Address)
	}
	for i := 0; i < 5; i++ {
		if got := serve(conversation); got != spill {
			t.Fatalf("after the spill pick %d went to %s, want %s", i, got.Address, spill.Address)
		}
	}
	// An unrelated prompt is not drawn to either.
	other := schedtest.Prompt("unrelated", 4096)
	res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: other})
	if err != nil {
		t.Fatal(err)
	}
	if res.Endpoints[0] == sticky {
		t.Fatalf("unrelated prompt went to the saturated endpoint")
	}
}

func TestScheduleAvoidsUnknownEndpoints(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	stale := schedtest.Load(0, 0) // the best load, but 10s old
	stale.ScrapedAt = time.Now().Add(-10 * time.Second)
	tp.Ep(t, 1).SetMetrics(stale)
	// pod 2 was never scraped.
	tp.Ep(t, 3).SetMetrics(schedtest.Load(3, 0.7))
	tp.Ep(t, 4).SetMetrics(schedtest.Load(4, 0.75))
	for i := 0; i < 50; i++ {
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		got := addresses(res)
		if got[0] != tp.Ep(t, 3).Address || got[1] != tp.Ep(t, 4).Address {
			t.Fatalf("pick %d: %v, want the known endpoints first", i, got)
		}
		if got[2] != tp.Ep(t, 1).Address && got[2] != tp.Ep(t, 2).Address {
			t.Fatalf("pick %d: %v, want an unknown endpoint last", i, got)
		}
	}

	// When nothing is known the pool still serves, from all of them.
	tp.Ep(t, 3).SetMetrics(stale)
	tp.Ep(t, 4).SetMetrics(stale)
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
		if err != nil {
			t.Fatalf("all-unknown pool: %v", err)
		}
		seen[res.Endpoints[0].Address] = true
	}
	if len(seen) != 4 {
		t.Fatalf("all-unknown pool: picks went to %d endpoints, want all 4", len(seen))
	}
}

// TestScheduleWeighsHeldRequests: the requests flow control holds for an
// endpoint count as its load, those of the request's priority and above
// only: a request does not wait behind lower bands there.
func TestScheduleWeighsHeldRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		objective string
		want      int // endpoint index
	}{
		{"held requests of its band count", "chat", 2},
		{"held requests of a lower band do not", "urgent", 1},
		{"a lower band sees every band above it", "batch", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustScheduler(t, "", Options{})
			tp := newTestPool(t, 2, s)
			tp.Pool.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1, "chat": 0, "urgent": 5}})
			tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
			// Endpoint 1 has nothing in flight and two chat requests held
			// for it; endpoint 2 has one request in flight.
			tp.Ep(t, 1).AddHeld(0, 2)
			tp.Ep(t, 2).AddInFlight(1)
			res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Objective: tc.objective})
			if err != nil {
				t.Fatal(err)
			}
			if res.Endpoints[0] != tp.Ep(t, tc.want) {
				t.Fatalf("picked %s, want endpoint %d (%s)", res.Endpoints[0].Address, tc.want, tp.Ep(t, tc.want).Address)
			}
		})
	}
}

const twoProfiles = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
- type: random-picker
  parameters:
    maxNumOfEndpoints: 1
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
- name: random
  plugins:
  - pluginRef: random-picker
`

func TestScheduleProfileFromAnnotation(t *testing.T) {
	s := mustScheduler(t, twoProfiles, Options{})
	tp := newTestPool(t, 3, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	cases := []struct {
		annotation  string
		wantProfile string
		wantLen     int
	}{
		{"", "default", 3},
		{"random", "random", 1},
		{"no-such-profile", "default", 3},
		{"default", "default", 3},
	}
	for _, c := range cases {
		// Changing the pool's annotation takes effect on the next request.
		tp.SetAnnotation(ProfileAnnotation, c.annotation)
		res, err := s.Schedule(ctx, tp.Pool, &Request{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Profile != c.wantProfile || len(res.Endpoints) != c.wantLen {
			t.Fatalf("annotation %q: profile %q with %d endpoints, want %q with %d", c.annotation, res.Profile, len(res.Endpoints), c.wantProfile, c.wantLen)
		}
	}
}

func TestScheduleSubsetHint(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 12, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	many := []string{"10.9.9.9:8000"}
	for i := 3; i <= 12; i++ {
		many = append(many, tp.Ep(t, i).Address)
	}
	cases := []struct {
		name    string
		subset  []string
		allowed []string
	}{
		{"small", []string{tp.Ep(t, 2).Address, tp.Ep(t, 5).Address, "10.9.9.9:8000"}, []string{tp.Ep(t, 2).Address, tp.Ep(t, 5).Address}},
		{"large", many, many[1:]},
		{"empty", []string{}, nil},
		{"foreign", []string{"10.9.9.9:8000"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := 0; i < 20; i++ {
				res, err := s.Schedule(ctx, tp.Pool, &Request{Subset: c.subset})
				if c.allowed == nil {
					if se := schedErr(t, err); se.Code != http.StatusServiceUnavailable {
						t.Fatalf("code %d, want 503", se.Code)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range addresses(res) {
					if !slices.Contains(c.allowed, a) {
						t.Fatalf("picked %s outside the subset %v", a, c.allowed)
					}
				}
			}
		})
	}
}

func TestScheduleConformanceTestFilter(t *testing.T) {
	s := mustScheduler(t, "", Options{EnableConformanceTestFilter: true})
	tp := newTestPool(t, 3, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	want := tp.Ep(t, 2)
	for i := 0; i < 10; i++ {
		res, err := s.Schedule(ctx, tp.Pool, &Request{CandidateIPs: []string{want.IP}})
		if err != nil {
			t.Fatal(err)
		}
		wantAddresses(t, res, want)
	}
	// Disabled, the request's candidate IPs are ignored.
	off := mustScheduler(t, "", Options{})
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		res, err := off.Schedule(ctx, tp.Pool, &Request{CandidateIPs: []string{want.IP}})
		if err != nil {
			t.Fatal(err)
		}
		seen[res.Endpoints[0].Address] = true
	}
	if len(seen) < 2 {
		t.Fatalf("with the filter off the candidate IPs still steered every pick: %v", seen)
	}
}

func TestScheduleNoEndpoints(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 0, s)
	_, err := s.Schedule(ctx, tp.Pool, &Request{})
	if se := schedErr(t, err); se.Code != http.StatusServiceUnavailable {
		t.Fatalf("code %d, want 503", se.Code)
	}
	_, err = s.Schedule(ctx, nil, &Request{})
	if se := schedErr(t, err); se.Code != http.StatusServiceUnavailable {
		t.Fatalf("nil pool: code %d, want 503", se.Code)
	}
}

func TestScheduleMaxEndpoints(t *testing.T) {
	cases := []struct {
		name   string
		config string
		opts   Options
		pods   int
		want   int
	}{
		{"default", "", Options{}, 5, 3},
		{"option", "", Options{MaxEndpoints: 1}, 5, 1},
		{"option above default", "", Options{MaxEndpoints: 5}, 5, 5},
		{"small pool", "", Options{}, 2, 2},
		{"picker cap", twoProfiles, Options{}, 5, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustScheduler(t, c.config, c.opts)
			tp := newTestPool(t, c.pods, s)
			tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
			res, err := s.Schedule(ctx, tp.Pool, &Request{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Endpoints) != c.want {
				t.Fatalf("%d endpoints, want %d", len(res.Endpoints), c.want)
			}
			seen := map[string]bool{}
			for _, a := range addresses(res) {
				if seen[a] {
					t.Fatalf("endpoint %s twice in %v", a, addresses(res))
				}
				seen[a] = true
			}
		})
	}
}

// TestSchedulePodLeavingMidTraffic removes a pod while goroutines schedule:
// no Schedule call that starts after SetPods returned may pick it.
func TestPluginDurationTimesEveryCall(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	asked := map[string]int{}
	s := mustScheduler(t, "", Options{PluginDuration: func(point string, p TypedName) func(time.Duration) {
		key := point + "/" + p.Name
		asked[key]++
		return func(d time.Duration) {
			if d < 0 {
				t.Errorf("%s: negative duration %v", key, d)
			}
			mu.Lock()
			calls[key]++
			mu.Unlock()
		}
	}})
	tp := newTestPool(t, 3, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	for range 2 {
		if _, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: schedtest.Prompt("hello", 64)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{
		FilterExtensionPoint + "/subset-filter",
		ScorerExtensionPoint + "/prefix-cache-scorer",
		ScorerExtensionPoint + "/queue-scorer",
		PickerExtensionPoint + "/max-score-picker",
	} {
		// Bound once when the scheduler is built, then called per request.
		if asked[key] != 1 || calls[key] != 2 {
			t.Errorf("%s: asked %d times, called %d times; want 1 and 2 (asked %v, called %v)", key, asked[key], calls[key], asked, calls)
		}
	}
}
func TestPromptBytes(t *testing.T) {
	cases := []struct {
		name   string
		config string // empty: the default config
		want   int
	}{
		{"default: 256 blocks of 64 bytes", "", prefix.DefaultHashBlockSize * prefix.DefaultMaxPrefixBlocksToMatch},
		{"parameters", header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {hashBlockSize: 16, maxPrefixBlocksToMatch: 4}\n", 64},
		{"largest of two scorers", header + "plugins:\n- {type: prefix-cache-scorer, name: small, parameters: {maxPrefixBlocksToMatch: 2}}\n" +
			"- {type: prefix-cache-scorer, name: big, parameters: {hashBlockSize: 128, maxPrefixBlocksToMatch: 1000}}\n" +
			"schedulingProfiles:\n- name: a\n  plugins: [{pluginRef: small}]\n- name: b\n  plugins: [{pluginRef: big}]\n", 128 * 1000},
		{"no prefix scorer reads no prompt", randomOnlyConfig, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(nil, Options{ConfigText: c.config})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.PromptBytes(); got != c.want {
				t.Fatalf("PromptBytes %d, want %d", got, c.want)
			}
		})
	}
}

// pinScorer scores 1 the endpoint at one address: a plugin of another
// package, as the scheduler sees one.
type pinScorer struct {
	name    TypedName
	address string
}

func (p *pinScorer) TypedName() TypedName { return p.name }

func (p *pinScorer) Score(_ context.Context, _ *framework.CycleState, _ *Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		if c[i].Endpoint.Address() == p.address {
			scores[i] = 1
		}
	}
	return nil
}

// pickCounter is a plugin that only hears of picks, and counts them in a
// metric it registers through its factory's handle.
type pickCounter struct {
	name    TypedName
	n       atomic.Int64
	primary atomic.Pointer[string]
	picks   prometheus.Counter
}

func (p *pickCounter) TypedName() TypedName { return p.name }

func (p *pickCounter) PostPick(_ context.Context, _ *framework.CycleState, _ *Request, res *framework.Result) {
	p.n.Add(1)
	a := res.Endpoints[0].Address()
	p.primary.Store(&a)
	p.picks.Inc()
}

// TestOptionsRegistry: a registry of the caller's own adds plugin types
// for the schedulers built with it, and leaves the built-in one alone; a
// factory gets a handle whose registerer is Options.Registerer.
func TestOptionsRegistry(t *testing.T) {
	const pinType = "pin-scorer"
	r := NewRegistry()
	err := r.Register(pinType, func(name string, raw json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
		var p struct {
			Address string `json:"address"`
		}
		if err := framework.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		return &pinScorer{name: TypedName{Type: pinType, Name: name}, address: p.Address}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	counter := &pickCounter{name: TypedName{Type: "pick-counter", Name: "pick-counter"}}
	if err := r.Register("pick-counter", func(_ string, _ json.RawMessage, h framework.Handle) (framework.Plugin, error) {
		counter.picks = prometheus.NewCounter(prometheus.CounterOpts{Name: "test_picks_total", Help: "Picks heard."})
		return counter, h.MetricsRegisterer().Register(counter.picks)
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(QueueScorerType, load.NewQueue); err == nil {
		t.Fatal("a built-in type registered twice")
	}
	tp := newTestPool(t, 4, nil)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	want := tp.Ep(t, 3)
	cfg := header + "plugins:\n- type: pin-scorer\n  parameters: {address: \"" + want.Address + "\"}\n- type: queue-scorer\n- type: pick-counter\n"
	metrics := prometheus.NewRegistry()
	s, err := New(nil, Options{Registry: r, ConfigText: cfg, Rand: schedtest.SeededRand(1), Registerer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		wantAddresses(t, &Result{Endpoints: res.Endpoints[:1]}, want)
	}
	if n := counter.n.Load(); n != 20 {
		t.Fatalf("post-pick-only plugin heard of %d picks, want 20", n)
	}
	if got := counter.primary.Load(); got == nil || *got != want.Address {
		t.Fatalf("post-pick plugin saw primary %v, want %s", got, want.Address)
	}
	if n, err := testutil.GatherAndCount(metrics, "test_picks_total"); err != nil || n != 1 {
		t.Fatalf("the plugin's metric in Options.Registerer: %d series, %v", n, err)
	}
	if v := testutil.ToFloat64(counter.picks); v != 20 {
		t.Fatalf("the plugin's metric counted %v picks, want 20", v)
	}
	if _, err := New(nil, Options{ConfigText: cfg}); err == nil || !strings.Contains(err.Error(), `unknown type "pin-scorer"`) {
		t.Fatalf("the built-in registry read the other registry's type: %v", err)
	}
	bad := header + "plugins:\n- type: pin-scorer\n  parameters: {adress: x}\n"
	if _, err := New(nil, Options{Registry: r, ConfigText: bad}); err == nil || !strings.Contains(err.Error(), `plugin "pin-scorer" (type pin-scorer): parameters: json: unknown field "adress"`) {
		t.Fatalf("bad parameter of a registered plugin: %v", err)
	}
}

// TestScheduleScores: asked for (Request.Scores), the result maps every
// endpoint the filters left to its weighted total, picked or not, the
// primary's the highest and a longer queue scoring lower; not asked for,
// there are none.
func TestScheduleScores(t *testing.T) {
	s := mustScheduler(t, "", Options{})
	tp := newTestPool(t, 4, s)
	for i, q := range []int{6, 0, 3, 9} {
		tp.Ep(t, i+1).SetMetrics(schedtest.Load(q, 0.2))
	}
	// The subset hint leaves endpoints 1 to 3 to score.
	subset := []string{tp.Ep(t, 1).Address, tp.Ep(t, 2).Address, tp.Ep(t, 3).Address}
	res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Subset: subset, Scores: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Scores) != len(subset) {
		t.Fatalf("scores %v, want one for each of %v", res.Scores, subset)
	}
	for _, a := range subset {
		if _, ok := res.Scores[a]; !ok {
			t.Fatalf("scores %v lack %s", res.Scores, a)
		}
	}
	short, mid, long := res.Scores[tp.Ep(t, 2).Address], res.Scores[tp.Ep(t, 3).Address], res.Scores[tp.Ep(t, 1).Address]
	if !(short > mid && mid > long && long >= 0) {
		t.Fatalf("scores by queue 0, 3, 6: %v, %v, %v; want decreasing", short, mid, long)
	}
	if res.Endpoints[0].Address != tp.Ep(t, 2).Address {
		t.Fatalf("primary %s, want the best scored %s", res.Endpoints[0].Address, tp.Ep(t, 2).Address)
	}
	res, err = s.Schedule(ctx, tp.Pool, &Request{Model: "m"})
	if err != nil || res.Scores != nil {
		t.Fatalf("scores %v (%v) without Request.Scores", res.Scores, err)
	}
}

// predictor predicts the primary endpoint's cache at every pick and hears
// the reports.
type predictor struct {
	heard []int
	ref   string
	ttft  time.Duration
}

func (p *predictor) TypedName() TypedName { return TypedName{Type: "predictor", Name: "predictor"} }

func (p *predictor) PostPick(_ context.Context, _ *framework.CycleState, _ *Request, res *framework.Result) {
	res.Predict(framework.CachePrediction{Observer: p, Ref: res.Endpoints[0].Address(), PredictedTokens: 64})
}

func (p *predictor) ObserveCachedTokens(c *framework.CachePrediction, cached int) {
	p.heard = append(p.heard, c.PredictedTokens, cached, c.ReportedPromptTokens)
	p.ref, _ = c.Ref.(string)
	p.ttft = c.ReportedTTFT
}

// TestObserveResponse: the server's report (cached and prompt tokens, TTFT)
// reaches the post-pick plugin that predicted, once, with its prediction,
// after Commit; a nil Result ignores it.
func TestObserveResponse(t *testing.T) {
	pr := &predictor{}
	r := NewRegistry()
	if err := r.Register("predictor", func(string, json.RawMessage, framework.Handle) (framework.Plugin, error) { return pr, nil }); err != nil {
		t.Fatal(err)
	}
	s, err := New(nil, Options{Registry: r, ConfigText: header + "plugins:\n- type: queue-scorer\n- type: predictor\n"})
	if err != nil {
		t.Fatal(err)
	}
	tp := newTestPool(t, 2, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	res, err := s.ScheduleDeferred(ctx, tp.Pool, &Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	res.ObserveResponse(1, 100, 0) // before Commit: nothing predicted yet
	res.Commit()
	res.ObserveResponse(48, 60, 250*time.Millisecond)
	res.ObserveResponse(48, 60, 250*time.Millisecond)
	if !slices.Equal(pr.heard, []int{64, 48, 60}) || pr.ref != res.Endpoints[0].Address || pr.ttft != 250*time.Millisecond {
		t.Fatalf("heard %v for %q after %v, want [64 48 60] once for %s after 250ms", pr.heard, pr.ref, pr.ttft, res.Endpoints[0].Address)
	}
	var none *Result
	none.ObserveResponse(5, 10, 0)
	none.Commit()
}

// TestPluginHandle: a factory's handle carries Options.BaseContext's
// context, so a plugin's goroutines can end with the scheduler's owner.
func TestPluginHandle(t *testing.T) {
	base, cancel := context.WithCancel(context.Background())
	var got context.Context
	r := NewRegistry()
	if err := r.Register("handle-keeper", func(name string, _ json.RawMessage, h framework.Handle) (framework.Plugin, error) {
		got = h.Context()
		return &pinScorer{name: TypedName{Type: "handle-keeper", Name: name}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, Options{Registry: r, ConfigText: header + "plugins:\n- type: handle-keeper\n", BaseContext: func() context.Context { return base }}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Err() != nil {
		t.Fatalf("handle context %v before the owner stopped", got)
	}
	cancel()
	if got.Err() == nil {
		t.Fatal("the handle's context is not done after BaseContext's was cancelled")
	}
}
