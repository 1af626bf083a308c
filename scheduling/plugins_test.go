package scheduling

import (
	"math"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

func build(t testing.TB, typ string, params string) Plugin {
	t.Helper()
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := builtins[typ](typ, raw)
	if err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	return p
}

func approxEqual(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func TestLoadScorers(t *testing.T) {
	type ep struct {
		m        *datastore.Metrics // nil: never scraped
		inFlight int64
	}
	fresh := func(waiting, running int, kv float64) *datastore.Metrics {
		return &datastore.Metrics{WaitingRequests: waiting, RunningRequests: running, KVCacheUsage: kv, ScrapedAt: time.Now()}
	}
	cases := []struct {
		name   string
		scorer string
		eps    []ep
		want   []float64
	}{
		{"queue spread", QueueScorerType, []ep{{m: fresh(0, 0, 0)}, {m: fresh(5, 0, 0)}, {m: fresh(10, 0, 0)}}, []float64{1, 0.5, 0}},
		{"queue equal", QueueScorerType, []ep{{m: fresh(3, 0, 0)}, {m: fresh(3, 0, 0)}}, []float64{1, 1}},
		{"queue unknown scores 0 and is left out of the range", QueueScorerType, []ep{{m: nil}, {m: fresh(2, 0, 0)}, {m: fresh(4, 0, 0)}}, []float64{0, 1, 0}},
		{"queue all unknown", QueueScorerType, []ep{{}, {}}, []float64{0, 0}},
		{"running spread", RunningRequestsScorerType, []ep{{m: fresh(0, 8, 0)}, {m: fresh(0, 2, 0)}, {m: fresh(9, 4, 0)}}, []float64{0, 1, 4.0 / 6}},
		{"kv absolute", KVCacheUtilizationScorerType, []ep{{m: fresh(0, 0, 0.25)}, {m: fresh(0, 0, 1)}, {m: nil}}, []float64{0.75, 0, 0}},
		{"in-flight spread, known without metrics", InFlightScorerType, []ep{{m: nil, inFlight: 4}, {m: fresh(0, 0, 0), inFlight: 0}, {m: nil, inFlight: 2}}, []float64{0, 1, 0.5}},
		{"in-flight equal", InFlightScorerType, []ep{{inFlight: 1}, {inFlight: 1}}, []float64{1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tp := newTestPool(t, len(c.eps), nil)
			cands := make([]Candidate, len(c.eps))
			for i, e := range c.eps {
				endpoint := tp.ep(t, i+1)
				endpoint.AddInFlight(e.inFlight)
				cands[i] = Candidate{Endpoint: endpoint, Metrics: e.m}
			}
			scores := make([]float64, len(cands))
			build(t, c.scorer, "").(Scorer).Score(ctx, newCycle(tp.pool, "m", 1), &Request{}, cands, scores)
			if !approxEqual(scores, c.want) {
				t.Fatalf("scores %v, want %v", scores, c.want)
			}
		})
	}
}

func TestLoRAAffinityScorer(t *testing.T) {
	m := func(running, waiting []string, max int) *datastore.Metrics {
		return &datastore.Metrics{RunningAdapters: running, WaitingAdapters: waiting, MaxAdapters: max, ScrapedAt: time.Now()}
	}
	cases := []struct {
		name  string
		model string
		m     *datastore.Metrics
		want  float64
	}{
		{"running", "a", m([]string{"x", "a"}, nil, 2), loraRunning},
		{"running and waiting", "a", m([]string{"a"}, []string{"a"}, 1), loraRunning},
		{"waiting, slot free", "a", m([]string{"x"}, []string{"a"}, 2), loraWaitingFree},
		{"waiting, max unknown", "a", m([]string{"x", "y", "z"}, []string{"a"}, 0), loraWaitingFree},
		{"waiting behind full slots", "a", m([]string{"x", "y"}, []string{"a"}, 2), loraWaitingFull},
		{"absent, slot free", "a", m([]string{"x"}, nil, 2), loraFreeSlot},
		{"absent, slots taken by waiting adapters", "a", m([]string{"x"}, []string{"y"}, 2), loraFull},
		{"absent, full", "a", m([]string{"x", "y"}, nil, 2), loraFull},
		{"absent, no LoRA on the server", "base", m(nil, nil, 0), loraFreeSlot},
		{"unknown metrics", "a", nil, 0},
		{"no model", "", nil, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tp := newTestPool(t, 1, nil)
			cands := []Candidate{{Endpoint: tp.ep(t, 1), Metrics: c.m}}
			scores := make([]float64, 1)
			build(t, LoRAAffinityScorerType, "").(Scorer).Score(ctx, newCycle(tp.pool, c.model, 1), &Request{}, cands, scores)
			if scores[0] != c.want {
				t.Fatalf("score %v, want %v", scores[0], c.want)
			}
		})
	}
	// The order the scorer promises.
	if !(loraRunning > loraWaitingFree && loraWaitingFree > loraFreeSlot && loraFreeSlot > loraWaitingFull && loraWaitingFull > loraFull) {
		t.Fatal("LoRA tiers out of order")
	}
}

func TestFilters(t *testing.T) {
	tp := newTestPool(t, 4, nil)
	addr := func(i int) string { return tp.ep(t, i).Address }
	ip := func(i int) string { return tp.ep(t, i).IP }
	var many []string
	for i := 0; i < 20; i++ {
		many = append(many, "10.0.0.1:"+string(rune('a'+i)))
	}
	many = append(many, addr(4), addr(2))
	cases := []struct {
		name   string
		filter string
		req    Request
		want   []int // pods kept, in pool order
	}{
		{"subset absent keeps all", SubsetFilterType, Request{}, []int{1, 2, 3, 4}},
		{"subset small", SubsetFilterType, Request{Subset: []string{addr(3), addr(1), "1.2.3.4:80"}}, []int{1, 3}},
		{"subset large", SubsetFilterType, Request{Subset: many}, []int{2, 4}},
		{"subset empty keeps none", SubsetFilterType, Request{Subset: []string{}}, nil},
		{"subset matches address, not IP", SubsetFilterType, Request{Subset: []string{ip(1)}}, nil},
		{"conformance absent keeps all", ConformanceTestFilterType, Request{}, []int{1, 2, 3, 4}},
		{"conformance by IP", ConformanceTestFilterType, Request{CandidateIPs: []string{ip(2), ip(4)}}, []int{2, 4}},
		{"conformance unknown IP", ConformanceTestFilterType, Request{CandidateIPs: []string{"10.1.1.1"}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cs := newCycle(tp.pool, "", 1)
			got := build(t, c.filter, "").(Filter).Filter(ctx, cs, &c.req, candidates(tp.pool))
			// Pool order is by address; compare as sets of addresses.
			if len(got) != len(c.want) {
				t.Fatalf("kept %d, want %d", len(got), len(c.want))
			}
			for _, i := range c.want {
				found := false
				for _, g := range got {
					found = found || g.Endpoint.Address == addr(i)
				}
				if !found {
					t.Fatalf("pod %d filtered out", i)
				}
			}
		})
	}
}

func TestPickers(t *testing.T) {
	tp := newTestPool(t, 5, nil)
	cands := candidates(tp.pool)
	const draws = 20000
	cases := []struct {
		name   string
		picker string
		scores []float64
		n      int
		// check gets how often each index came first, and one pick.
		check func(t *testing.T, first []int, one []int)
	}{
		{"max-score orders by score", MaxScorePickerType, []float64{1, 5, 3, 4, 2}, 3, func(t *testing.T, first, one []int) {
			if one[0] != 1 || one[1] != 3 || one[2] != 2 || first[1] != draws {
				t.Fatalf("picked %v, first counts %v", one, first)
			}
		}},
		{"max-score breaks ties uniformly", MaxScorePickerType, []float64{2, 2, 1, 2, 2.0000000000001}, 2, func(t *testing.T, first, one []int) {
			if one[0] == one[1] || first[2] != 0 {
				t.Fatalf("picked %v, first counts %v", one, first)
			}
			for _, i := range []int{0, 1, 3, 4} {
				within(t, first[i], draws, 0.25)
			}
		}},
		{"random is uniform", RandomPickerType, []float64{9, 0, 0, 0, 0}, 3, func(t *testing.T, first, one []int) {
			if one[0] == one[1] || one[1] == one[2] || one[0] == one[2] {
				t.Fatalf("repeated endpoint: %v", one)
			}
			for i := range first {
				within(t, first[i], draws, 0.2)
			}
		}},
		{"weighted-random follows scores", WeightedRandomPickerType, []float64{1, 0, 3, 0, 4}, 5, func(t *testing.T, first, one []int) {
			within(t, first[0], draws, 1.0/8)
			within(t, first[2], draws, 3.0/8)
			within(t, first[4], draws, 4.0/8)
			if first[1]+first[3] != 0 || len(one) != 5 {
				t.Fatalf("zero-score endpoints first %d times; picked %v", first[1]+first[3], one)
			}
			if one[3] != 1 && one[3] != 3 || one[4] != 1 && one[4] != 3 {
				t.Fatalf("zero-score endpoints must come last: %v", one)
			}
		}},
		{"round-robin takes turns", RoundRobinPickerType, []float64{9, 0, 0, 0, 0}, 2, func(t *testing.T, first, one []int) {
			if one[1] != (one[0]+1)%5 {
				t.Fatalf("picked %v, want consecutive endpoints", one)
			}
			for i := range first {
				if first[i] != draws/5 {
					t.Fatalf("first counts %v, want %d each", first, draws/5)
				}
			}
		}},
		{"weighted-random with all zero is uniform", WeightedRandomPickerType, []float64{0, 0, 0, 0, 0}, 1, func(t *testing.T, first, one []int) {
			for i := range first {
				within(t, first[i], draws, 0.2)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := build(t, c.picker, "").(Picker)
			cs := newCycle(tp.pool, "", 7)
			first := make([]int, len(cands))
			var one []int
			for i := 0; i < draws; i++ {
				one = p.Pick(ctx, cs, &Request{}, cands, c.scores, c.n, nil)
				if len(one) != c.n {
					t.Fatalf("picked %d, want %d", len(one), c.n)
				}
				first[one[0]]++
			}
			c.check(t, first, one)
		})
	}
}

// within fails unless count/draws is within 5 binomial standard deviations of p.
func within(t *testing.T, count, draws int, p float64) {
	t.Helper()
	sd := math.Sqrt(float64(draws) * p * (1 - p))
	if math.Abs(float64(count)-float64(draws)*p) > 5*sd {
		t.Fatalf("%d of %d, want %.0f ± %.0f", count, draws, float64(draws)*p, 5*sd)
	}
}

func TestPartitionKnown(t *testing.T) {
	tp := newTestPool(t, 6, nil)
	m := &datastore.Metrics{}
	c := candidates(tp.pool)
	known := []bool{false, true, false, false, true, true}
	for i := range c {
		c[i].Metrics = nil
		if known[i] {
			c[i].Metrics = m
		}
	}
	orig := append([]Candidate{}, c...)
	if k := partitionKnown(c); k != 3 {
		t.Fatalf("%d known, want 3", k)
	}
	want := []int{1, 4, 5, 0, 2, 3}
	for i, j := range want {
		if c[i].Endpoint != orig[j].Endpoint {
			t.Fatalf("position %d holds %s, want %s (stable order)", i, c[i].Endpoint.Address, orig[j].Endpoint.Address)
		}
	}
}
