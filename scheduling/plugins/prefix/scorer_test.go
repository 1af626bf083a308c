// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

var ctx = context.Background()

// build is the scorer from its factory, with params as the config gives
// them (empty: none).
func build(t testing.TB, params string) *Scorer {
	t.Helper()
	return schedtest.Build(t, Type, New, params).(*Scorer)
}

func TestHashPrompt(t *testing.T) {
	seed := maphash.MakeSeed()
	p := schedtest.Prompt("abc", 1000)
	cases := []struct {
		name      string
		prompt    []byte
		model     string
		block     int
		maxBlocks int
		want      int
	}{
		{"whole blocks only", p, "m", 64, 256, 15},
		{"capped", p, "m", 64, 4, 4},
		{"shorter than a block", p[:63], "m", 64, 256, 0},
		{"empty", nil, "m", 64, 256, 0},
		{"block of one byte", p[:10], "m", 1, 256, 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := hashPrompt(seed, nil, c.model, c.prompt, c.block, c.maxBlocks); len(got) != c.want {
				t.Fatalf("%d hashes, want %d", len(got), c.want)
			}
		})
	}

	a := hashPrompt(seed, nil, "m", p, 64, 256)
	// Chained: a prompt sharing the first 5 blocks shares exactly 5 hashes.
	q := append(append([]byte{}, p[:320]...), schedtest.Prompt("xyz", 680)...)
	b := hashPrompt(seed, nil, "m", q, 64, 256)
	for i := range b {
		if same := a[i] == b[i]; same != (i < 5) {
			t.Fatalf("block %d: equal=%v, want %v", i, same, i < 5)
		}
	}
	// The same block text after a different prefix hashes differently.
	r := append(append([]byte{}, schedtest.Prompt("zzz", 64)...), p[64:]...)
	if c := hashPrompt(seed, nil, "m", r, 64, 256); c[1] == a[1] {
		t.Fatal("block 1 hash ignores the block before it")
	}
	// Another model never matches.
	if c := hashPrompt(seed, nil, "other", p, 64, 256); c[0] == a[0] {
		t.Fatal("prompt hashes ignore the model")
	}
	// Deterministic for a seed; another seed hashes differently.
	if c := hashPrompt(seed, nil, "m", p, 64, 256); c[14] != a[14] {
		t.Fatal("hashes differ between runs")
	}
	if c := hashPrompt(maphash.MakeSeed(), nil, "m", p, 64, 256); c[14] == a[14] {
		t.Fatal("hashes ignore the seed")
	}
}

// prefixFixture is a prefix scorer over a real pool.
type prefixFixture struct {
	t  *testing.T
	tp *schedtest.Pool
	s  *Scorer
}

func newPrefixFixture(t *testing.T, pods int, params string) *prefixFixture {
	s := build(t, params)
	tp := schedtest.NewPool(t, pods)
	tp.Reg.AddObserver(schedtest.Observer(s))
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	return &prefixFixture{t: t, tp: tp, s: s}
}

// score scores every endpoint for the prompt and returns the scores by pod
// (index 0 unused); with record > 0 it then records the prompt on that pod.
func (f *prefixFixture) score(p []byte, record int) []float64 {
	f.t.Helper()
	cs := schedtest.NewCycle(f.tp.Pool, "m", 1)
	cands := schedtest.Candidates(f.tp.Pool)
	scores := make([]float64, len(cands))
	f.s.Score(ctx, cs, &framework.Request{Prompt: p}, cands, scores)
	out := make([]float64, len(f.tp.Pods)+1)
	for i := 1; i < len(out); i++ {
		for j, c := range cands {
			if c.Endpoint.Address() == schedtest.PodSource(i).IP+":8000" {
				out[i] = scores[j]
			}
		}
	}
	if record > 0 {
		f.s.PostPick(ctx, cs, &framework.Request{Prompt: p}, &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(f.tp.Ep(f.t, record))}})
	}
	return out
}

func (f *prefixFixture) index() *prefixIndex {
	v, ok := f.s.indexes.Load(dsview.Pool(f.tp.Pool))
	if !ok {
		return nil
	}
	return v.(*prefixIndex)
}

func TestPrefixScorer(t *testing.T) {
	base := schedtest.Prompt("sys", 640) // 10 blocks
	half := append(append([]byte{}, base[:320]...), schedtest.Prompt("other", 320)...)
	cases := []struct {
		name string
		// records are (prompt, pod) recorded in order before scoring.
		records []struct {
			p   []byte
			pod int
		}
		score []byte
		want  []float64 // by pod 1..3
	}{
		{"nothing recorded", nil, base, []float64{0, 0, 0}},
		{"exact prompt recorded on pod 2", []struct {
			p   []byte
			pod int
		}{{base, 2}}, base, []float64{0, 1, 0}},
		{"half shared", []struct {
			p   []byte
			pod int
		}{{base, 2}, {half, 3}}, base, []float64{0, 1, 0.5}},
		{"longer prompt than cached", []struct {
			p   []byte
			pod int
		}{{base[:320], 1}}, base, []float64{0.5, 0, 0}},
		{"prompt under one block", []struct {
			p   []byte
			pod int
		}{{base, 1}}, base[:50], []float64{0, 0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 3, "")
			for _, r := range c.records {
				f.score(r.p, r.pod)
			}
			got := f.score(c.score, 0)[1:]
			if !schedtest.ApproxEqual(got, c.want) {
				t.Fatalf("scores %v, want %v", got, c.want)
			}
		})
	}
}

func TestPrefixScorerKeepsAffinityWhenSaturated(t *testing.T) {
	// Saturation is an admission signal, not a reason to give up a cache:
	// a full KV cache or a queue at the threshold keeps the plain score.
	f := newPrefixFixture(t, 2, "")
	p := schedtest.Prompt("x", 640)
	f.score(p, 1)
	for _, m := range []*datastore.Metrics{schedtest.Load(schedtest.Saturation.QueueDepth, 0.1), schedtest.Load(0, 0.95), schedtest.Load(40, 1), nil} {
		f.tp.Ep(t, 1).SetMetrics(m)
		if got := f.score(p, 0); got[1] != 1 {
			t.Fatalf("metrics %+v: score %v, want 1", m, got[1])
		}
	}
}

func TestPrefixScorerWeighsLoadAgainstMiss(t *testing.T) {
	// A 4,096-byte prompt is 1,024 tokens at 4 bytes a token; pod 1 holds
	// all of it, pod 2 its first half, pod 3 nothing. Each request an
	// endpoint has in flight beyond the least loaded costs 128 tokens over
	// 1 + the least load in batches (the most sequences seen running).
	p := schedtest.Prompt("shared system prompt", 4096)
	cases := []struct {
		name     string
		inFlight [4]int64 // by pod
		metrics  [4]*datastore.Metrics
		want     []float64
	}{
		{name: "equal load: the share matched", want: []float64{1, 0.5, 0}},
		{name: "holder busier by 2", inFlight: [4]int64{0, 2, 0, 0}, want: []float64{1 - 256.0/1024, 0.5, 0}},
		{name: "holder busier by 8: its cache is worth no more than half a cache on an idle server", inFlight: [4]int64{0, 8, 0, 0}, want: []float64{0, 0.5, 0}},
		{name: "everyone busy alike", inFlight: [4]int64{0, 5, 5, 5}, want: []float64{1, 0.5, 0}},
		{name: "half holder busier, the least load 1 of a batch of 1: half the cost", inFlight: [4]int64{0, 1, 3, 1}, want: []float64{1, 0.5 - 2*64.0/1024, 0}},
		{name: "every endpoint busy (least load 8, batches of 4): a third of the cost", inFlight: [4]int64{0, 14, 8, 8},
			metrics: [4]*datastore.Metrics{nil, {RunningRequests: 4, ScrapedAt: time.Now()}, {RunningRequests: 4, ScrapedAt: time.Now()}, {RunningRequests: 4, ScrapedAt: time.Now()}},
			want:    []float64{1 - 6*128.0/3/1024, 0.5, 0}},
		{name: "scrape says more than in flight (another picker's requests)", metrics: [4]*datastore.Metrics{nil, {RunningRequests: 4, WaitingRequests: 2, ScrapedAt: time.Now()}, nil, nil},
			want: []float64{1 - 6*128.0/1024, 0.5, 0}},
		{name: "more than the holder's load never goes negative", inFlight: [4]int64{0, 100, 0, 0}, want: []float64{0, 0.5, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 3, `{"queueCostTokens": 128}`)
			f.score(p, 1)
			f.score(p[:2048], 2)
			for pod := 1; pod <= 3; pod++ {
				e := f.tp.Ep(t, pod)
				e.AddInFlight(c.inFlight[pod])
				defer e.AddInFlight(-c.inFlight[pod])
				if m := c.metrics[pod]; m != nil {
					e.SetMetrics(m)
				}
			}
			got := f.score(p, 0)[1:]
			for i := range got {
				got[i] = min(max(got[i], 0), 1) // as the profile clamps
			}
			if !schedtest.ApproxEqual(got, c.want) {
				t.Fatalf("scores %v, want %v", got, c.want)
			}
		})
	}
}

func TestPrefixLRUEvictionAndCapacity(t *testing.T) {
	f := newPrefixFixture(t, 2, `{"hashBlockSize": 64, "lruCapacityPerServer": 20}`)
	// 20 blocks fit; a second prompt of 15 blocks evicts 15 of the first's
	// blocks, its least recently used: the tail, since the head was touched
	// last.
	a, b := schedtest.Prompt("a", 64*20), schedtest.Prompt("b", 64*15)
	f.score(a, 1)
	if got := f.score(a, 0)[1]; got != 1 {
		t.Fatalf("a scores %v after recording", got)
	}
	f.score(b, 1)
	if got := f.score(a, 0)[1]; !schedtest.ApproxEqual([]float64{got}, []float64{5.0 / 20}) {
		t.Fatalf("a scores %v after eviction, want 5/20 (its head survives)", got)
	}
	if got := f.score(b, 0)[1]; got != 1 {
		t.Fatalf("b scores %v, want 1", got)
	}
	pe := f.index().lookup(framework.EndpointKey(f.tp.Ep(t, 1).Key()))
	if n := pe.len(); n != 20 {
		t.Fatalf("LRU holds %d blocks, want its capacity 20", n)
	}
	if n := f.index().blocks(); n != 20 {
		t.Fatalf("index holds %d blocks, want 20: evicted blocks must leave it", n)
	}

	// The server's cache size, once scraped, resizes the LRU:
	// 10 blocks × 16 tokens × 4 bytes / 64 bytes = 10 blocks.
	m := schedtest.Load(0, 0.1)
	m.NumBlocks, m.BlockSize = 10, 16
	f.tp.Ep(t, 1).SetMetrics(m)
	if c := f.s.capacity(f.index(), dsview.Metrics(m)); c != 10 {
		t.Fatalf("capacity %d, want 10", c)
	}
	f.score(b[:64], 1)
	if n := pe.len(); n != 10 {
		t.Fatalf("LRU holds %d blocks after resize, want 10", n)
	}
	if n := f.index().blocks(); n != 10 {
		t.Fatalf("index holds %d blocks after resize, want 10", n)
	}
}

// TestPrefixServerCounterAging checks that a new sample of a server's
// prefix-cache counters ages its LRU by the blocks the server computed
// beyond those this index recorded there (another replica's requests).
// Pod 1's LRU holds 20 blocks and has prompt a's 10; a sample sets the
// base, then the server's computed tokens grow by grow and the next sample
// is seen; a's score on pod 1 is what remains of it.
func TestPrefixServerCounterAging(t *testing.T) {
	const tokensPerBlock = 16 // 64-byte blocks of 4-byte tokens
	cases := []struct {
		name string
		// off leaves serverCounterAging out of the parameters.
		off bool
		// noCounters: the samples carry no prefix-cache counters.
		noCounters bool
		// grow is the server's computed tokens between the samples; own
		// is a prompt this index records on pod 1 in between, and report
		// the cached tokens the server then reports for it (none if 0).
		grow   float64
		own    []byte
		report int
		want   float64
	}{
		{name: "the server computed nothing", want: 1},
		{name: "others' 10 blocks fill the free room", grow: 10 * tokensPerBlock, want: 1},
		{name: "others' 15 blocks push out a's 5 oldest", grow: 15 * tokensPerBlock, want: 0.5},
		{name: "a part of a block is carried, not aged", grow: 10.9 * tokensPerBlock, want: 1},
		{name: "more than the cache pushes out all of a", grow: 100 * tokensPerBlock, want: 0},
		{name: "the server computed only this index's blocks", grow: 5 * tokensPerBlock, own: schedtest.Prompt("own", 64*15), want: 0.5},
		{name: "this index's blocks are not counted twice", grow: 10 * tokensPerBlock, own: schedtest.Prompt("own", 64*5), want: 1},
		// a again, predicted whole, and the server had none of it: of the
		// 25 blocks it computed, 10 were a's, so 15 others' push out 5.
		{name: "an own request the server missed is not another's", grow: 25 * tokensPerBlock, own: schedtest.Prompt("a", 64*10), report: -1, want: 0.5},
		{name: "counters that fell (a restart) only set the base", grow: -500, want: 1},
		{name: "a server without the counters is not aged", noCounters: true, grow: 100 * tokensPerBlock, want: 1},
		{name: "off (the plugin default)", off: true, grow: 100 * tokensPerBlock, want: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			params := `{"serverCounterAging": true, "hashBlockSize": 64, "lruCapacityPerServer": 20}`
			if c.off {
				params = `{"hashBlockSize": 64, "lruCapacityPerServer": 20}`
			}
			f := newPrefixFixture(t, 2, params)
			a := schedtest.Prompt("a", 64*10)
			sample := func(computed float64) {
				m := schedtest.Load(0, 0.1)
				if !c.noCounters {
					m.PrefixCacheQueries, m.PrefixCacheHits = 10000+computed, 10000
				}
				f.tp.Ep(t, 1).SetMetrics(m)
			}
			f.score(a, 1)
			sample(1000)
			if got := f.score(a, 0)[1]; got != 1 {
				t.Fatalf("a scores %v on the base sample, want 1", got)
			}
			if c.own != nil {
				cs := schedtest.NewCycle(f.tp.Pool, "m", 1)
				req := &framework.Request{Prompt: c.own}
				f.s.Score(ctx, cs, req, schedtest.Candidates(f.tp.Pool), make([]float64, 2))
				res := &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(f.tp.Ep(t, 1))}}
				f.s.PostPick(ctx, cs, req, res)
				if c.report != 0 {
					p := res.Prediction()
					f.s.ObserveCachedTokens(&p, max(c.report, 0))
				}
			}
			sample(1000 + c.grow)
			if got := f.score(a, 0)[1]; !schedtest.ApproxEqual([]float64{got}, []float64{c.want}) {
				t.Fatalf("a scores %v, want %v", got, c.want)
			}
			pe := f.index().lookup(framework.EndpointKey(f.tp.Ep(t, 1).Key()))
			pe.mu.Lock()
			held := pe.lru.len() + pe.lru.phantomBlocks
			pe.mu.Unlock()
			if held > 20 {
				t.Fatalf("LRU holds %d blocks and phantoms, capacity 20", held)
			}
			// The same sample seen again ages nothing more.
			if got := f.score(a, 0)[1]; !schedtest.ApproxEqual([]float64{got}, []float64{c.want}) {
				t.Fatalf("a scores %v on the sample seen again, want %v", got, c.want)
			}
		})
	}
}

func TestPrefixCapacity(t *testing.T) {
	cases := []struct {
		name   string
		params string
		m      *datastore.Metrics
		// scale is the servers' tokens over the estimate reported (0:
		// none yet).
		scale float64
		want  int
	}{
		{"unknown metrics", "", nil, 0, DefaultLRUCapacityPerServer},
		{"no cache info", "", &datastore.Metrics{}, 0, DefaultLRUCapacityPerServer},
		{"vLLM-sized cache", "", &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 0, 30000},
		{"bytes per token", `{"bytesPerToken": 2}`, &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 0, 15000},
		{"auto-tune off", `{"autoTune": false, "lruCapacityPerServer": 7}`, &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 0, 7},
		{"tiny cache", "", &datastore.Metrics{NumBlocks: 1, BlockSize: 1}, 0, 1},
		{"huge cache is capped", "", &datastore.Metrics{NumBlocks: 1 << 30, BlockSize: 1 << 10}, 0, DefaultMaxLRUCapacityPerServer},
		// Prompts of longer words than 4 bytes: the servers count 2
		// tokens where the estimate counts 3, and hold 3/2 the bytes.
		{"servers' tokens", "", &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 2.0 / 3, 45000},
		{"servers' tokens, not scaled", `{"tokenScaledCapacity": false}`, &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 2.0 / 3, 30000},
		{"auto-tune off is not scaled", `{"autoTune": false, "lruCapacityPerServer": 7}`, &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 2.0 / 3, 7},
		{"cap set", `{"maxLRUCapacityPerServer": 1000}`, &datastore.Metrics{NumBlocks: 30000, BlockSize: 16}, 0, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := build(t, c.params)
			x := newPrefixIndex(nil)
			if c.scale > 0 {
				x.observeTokenScale(c.scale)
			}
			if got := s.capacity(x, dsview.Metrics(c.m)); got != c.want {
				t.Fatalf("capacity %d, want %d", got, c.want)
			}
		})
	}
}

func TestPrefixDropsDepartedEndpoints(t *testing.T) {
	f := newPrefixFixture(t, 3, "")
	shared := schedtest.Prompt("shared", 640)
	for pod := 1; pod <= 3; pod++ {
		f.score(shared, pod)
	}
	f.score(schedtest.Prompt("only-on-1", 640), 1)
	if n := f.index().blocks(); n != 20 {
		t.Fatalf("index holds %d blocks, want 20", n)
	}
	gone := f.tp.Ep(t, 1)
	slot := f.index().lookup(framework.EndpointKey(gone.Key())).slot

	f.tp.Pool.SetPods(f.tp.Pods[1:])
	if f.index().lookup(framework.EndpointKey(gone.Key())) != nil {
		t.Fatal("departed endpoint still has an LRU")
	}
	if n := f.index().blocks(); n != 10 {
		t.Fatalf("index holds %d blocks, want the 10 shared ones", n)
	}
	if got := f.score(shared, 0); got[1] != 0 || got[2] != 1 || got[3] != 1 {
		t.Fatalf("remaining endpoints score %v", got)
	}
	// A pick of the departed endpoint recorded late creates nothing.
	cs := schedtest.NewCycle(f.tp.Pool, "m", 1)
	f.s.Score(ctx, cs, &framework.Request{Prompt: shared}, schedtest.Candidates(f.tp.Pool), make([]float64, 2))
	f.s.PostPick(ctx, cs, &framework.Request{Prompt: shared}, &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(gone)}})
	if f.index().lookup(framework.EndpointKey(gone.Key())) != nil {
		t.Fatal("late record of a departed endpoint created state")
	}
	// The endpoint comes back: it starts cold, in the reused slot.
	f.tp.Pool.SetPods(f.tp.Pods)
	back := f.tp.Ep(t, 1)
	f.tp.Ep(t, 1).SetMetrics(schedtest.Load(0, 0.1))
	if got := f.score(shared, 0); got[1] != 0 {
		t.Fatalf("returning endpoint scores %v, want 0", got[1])
	}
	f.score(schedtest.Prompt("new", 640), 1)
	if pe := f.index().lookup(framework.EndpointKey(back.Key())); pe == nil || pe.slot != slot {
		t.Fatalf("returning endpoint state %+v, want slot %d reused", pe, slot)
	}

	f.tp.Reg.Remove(f.tp.Pool.Key)
	if f.index() != nil {
		t.Fatal("index kept after its pool was removed")
	}
}

func TestPrefixCycleStateReuse(t *testing.T) {
	// A recycled CycleState must not leak one request's hashes into the next.
	f := newPrefixFixture(t, 2, "")
	cs := schedtest.NewCycle(f.tp.Pool, "m", 1)
	cands := schedtest.Candidates(f.tp.Pool)
	f.s.Score(ctx, cs, &framework.Request{Prompt: schedtest.Prompt("a", 640)}, cands, make([]float64, 2))
	cs.Begin(dsview.Pool(f.tp.Pool), schedtest.Saturation, schedtest.SeededRand(1))
	if _, ok := cs.Read(f.s.key); ok {
		t.Fatal("state of the previous cycle readable after reset")
	}
	// No Score this cycle (e.g. the profile has no prompt): PostPick records nothing.
	f.s.PostPick(ctx, cs, &framework.Request{}, &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(f.tp.Ep(t, 1))}})
	if n := f.index().blocks(); n != 0 {
		t.Fatalf("index holds %d blocks from a stale cycle", n)
	}
}

func TestIndexHolders(t *testing.T) {
	cases := []struct {
		name    string
		holders []int // endpoints added, in order
		remove  int
		want    []int // holders left, any order
	}{
		{"only holder", []int{0}, 0, nil},
		{"first of two", []int{0, 1}, 0, []int{1}},
		{"second of two", []int{0, 1}, 1, []int{0}},
		{"middle of three", []int{0, 1, 2}, 1, []int{0, 2}},
		{"first of three", []int{0, 1, 2}, 0, []int{1, 2}},
		{"not a holder", []int{0, 1}, 2, []int{0, 1}},
		{"added twice", []int{0, 1, 1, 0}, 0, []int{1}},
	}
	for _, c := range cases {
		for _, bulk := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/bulk=%v", c.name, bulk), func(t *testing.T) {
				x := newPrefixIndex(nil)
				pes := []*prefixEndpoint{{slot: 0}, {slot: 1}, {slot: 2}}
				const h = 42
				for _, i := range c.holders {
					x.addHolder(h, pes[i])
				}
				if bulk {
					x.sweep(pes[c.remove], []uint64{7, h, 99})
				} else {
					x.removeHolder(h, pes[c.remove])
				}
				matched := make([]int32, 3)
				x.match([]uint64{h}, matched, new([]int32))
				for i := range pes {
					if got, want := matched[i] == 1, slices.Contains(c.want, i); got != want {
						t.Fatalf("endpoint %d holds the block: %v, want %v", i, got, want)
					}
				}
				if want := min(len(c.want), 1); x.blocks() != want {
					t.Fatalf("%d index entries, want %d", x.blocks(), want)
				}
			})
		}
	}
}

// TestPromptBytesCutChangesNothing holds the promise of PromptBytes: a
// prompt cut to it scores and records exactly as the whole prompt.
func TestPromptBytesCutChangesNothing(t *testing.T) {
	const params = `{"hashBlockSize": 16, "maxPrefixBlocksToMatch": 4}`
	limit := build(t, params).PromptBytes()
	long := schedtest.Prompt("shared", 1000)
	// Differs from long only past the limit.
	tail := append(append([]byte{}, long[:limit]...), schedtest.Prompt("other", 500)...)
	for _, p := range [][]byte{long, tail, long[:limit], long[:limit+15]} {
		whole, cut := newPrefixFixture(t, 3, params), newPrefixFixture(t, 3, params)
		whole.score(long, 2)
		cut.score(long[:limit], 2)
		a, b := whole.score(p, 0), cut.score(p[:min(len(p), limit)], 0)
		if !schedtest.ApproxEqual(a, b) || a[2] != 1 {
			t.Fatalf("prompt of %d bytes: whole %v, cut %v; want equal, pod 2 at 1", len(p), a, b)
		}
		if x, y := whole.index().blocks(), cut.index().blocks(); x != y || x != 4 {
			t.Fatalf("blocks recorded: whole %d, cut %d, want 4", x, y)
		}
	}
}

// TestIndexMatch holds the bisecting match to a walk over every block, for
// endpoints holding prefixes of every length (what record leaves: see
// match), including none and all, and prompts of 1 to 300 blocks.
func TestIndexMatch(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		blocks := 1 + rnd.IntN(300)
		endpoints := 1 + rnd.IntN(12)
		hashes := make([]uint64, blocks)
		for i := range hashes {
			hashes[i] = rnd.Uint64()
		}
		x := newPrefixIndex(nil)
		want := make([]int32, endpoints)
		for e := 0; e < endpoints; e++ {
			pe := &prefixEndpoint{slot: int32(e)}
			switch rnd.IntN(4) {
			case 0: // none
			case 1:
				want[e] = int32(blocks)
			default:
				want[e] = int32(rnd.IntN(blocks + 1))
			}
			for i := 0; i < int(want[e]); i++ {
				x.addHolder(hashes[i], pe)
			}
		}
		matched := make([]int32, endpoints)
		var scratch []int32
		longest := x.match(hashes, matched, &scratch)
		wantLongest := int32(0)
		for e := range want {
			wantLongest = max(wantLongest, want[e])
			if matched[e] != want[e] {
				t.Fatalf("trial %d (%d blocks): endpoint %d matched %d, holds %d", trial, blocks, e, matched[e], want[e])
			}
		}
		if longest != int(wantLongest) {
			t.Fatalf("trial %d: longest %d, want %d", trial, longest, wantLongest)
		}
	}
}

// TestRecordKeepsPrefixes: what record and LRU eviction leave an endpoint
// holding of any prompt is a prefix of it, which is what match relies on.
func TestRecordKeepsPrefixes(t *testing.T) {
	tp := schedtest.NewPool(t, 1)
	x := newPrefixIndex(nil)
	pe := x.endpointFor(dsview.Pool(tp.Pool), dsview.Endpoint(tp.Pool.Endpoints().Endpoints[0]), 100)
	rnd := rand.New(rand.NewPCG(3, 4))
	var prompts [][]uint64
	for i := 0; i < 40; i++ {
		p := make([]uint64, 1+rnd.IntN(60))
		for j := range p {
			p[j] = rnd.Uint64()
		}
		if i > 0 && rnd.IntN(2) == 0 {
			// Shares a prefix with an earlier prompt.
			old := prompts[rnd.IntN(len(prompts))]
			copy(p, old[:min(len(old), rnd.IntN(len(p))+1)])
		}
		prompts = append(prompts, p)
		pe.record(p, 100, 0) // 100 blocks: evicts all the time
		for k, q := range prompts {
			held := 0
			for held < len(q) {
				if !pe.lru.contains(q[held]) {
					break
				}
				held++
			}
			for j := held; j < len(q); j++ {
				if pe.lru.contains(q[j]) {
					t.Fatalf("after record %d, prompt %d: block %d held though block %d is not", i, k, j, held)
				}
			}
		}
	}
}

// TestRecordAgainstTouchingEachBlock holds record, which moves a prompt's
// leading blocks as one run when they are already the most recent, to what
// touching every block last to first does (golang-lru as the reference):
// same blocks in the same order, and the index lists the endpoint as a
// holder of exactly the blocks it holds. The prompts repeat, share
// prefixes, repeat a block within themselves, and overflow the capacity.
func TestRecordAgainstTouchingEachBlock(t *testing.T) {
	const capacity = 64
	tp := schedtest.NewPool(t, 1)
	x := newPrefixIndex(nil)
	pe := x.endpointFor(dsview.Pool(tp.Pool), dsview.Endpoint(tp.Pool.Endpoints().Endpoints[0]), capacity)
	ref, _ := simplelru.NewLRU[uint64, struct{}](capacity, nil)
	rnd := rand.New(rand.NewPCG(7, 8))
	var prompts [][]uint64
	seen := map[uint64]bool{}
	fixed := [][]uint64{
		{1, 2, 3},
		{1, 2, 3},       // held whole, in order: the run is the prompt
		{1, 2, 3, 4, 2}, // the run's 2 again after it: the run breaks
		{1, 2, 5},       // a shared prefix and a new block
		{5, 1, 2},       // held, but not in order from the front
	}
	for i := 0; i < 3000; i++ {
		var p []uint64
		switch r := rnd.IntN(10); {
		case i < len(fixed):
			p = fixed[i]
		case r < 3 && len(prompts) > 0: // the same prompt again
			p = prompts[rnd.IntN(len(prompts))]
		case r < 7 && len(prompts) > 0: // an earlier prompt's prefix, then new blocks
			old := prompts[rnd.IntN(len(prompts))]
			p = append(slices.Clone(old[:1+rnd.IntN(len(old))]), randomBlocks(rnd, rnd.IntN(20))...)
		default:
			p = randomBlocks(rnd, 1+rnd.IntN(40))
		}
		if rnd.IntN(20) == 0 && len(p) > 2 { // a block repeated within the prompt
			p = slices.Clone(p)
			p[len(p)-1] = p[rnd.IntN(len(p)-1)]
		}
		if rnd.IntN(50) == 0 { // far more than the capacity
			p = randomBlocks(rnd, capacity+rnd.IntN(capacity))
		}
		prompts = append(prompts, p)
		pe.record(p, capacity, 0)
		for j := len(p) - 1; j >= 0; j-- {
			if _, ok := ref.Get(p[j]); !ok {
				ref.Add(p[j], struct{}{})
			}
			seen[p[j]] = true
		}
		want := ref.Keys() // oldest first
		slices.Reverse(want)
		if got := pe.lru.keys(); !slices.Equal(got, want) {
			t.Fatalf("record %d (%d blocks): held %v, reference %v", i, len(p), got, want)
		}
	}
	for h := range seen {
		holds := ref.Contains(h)
		listed := slices.Contains(x.appendHolders(nil, h), pe.slot)
		if holds != listed {
			t.Fatalf("block %x: held %v, listed in the index %v", h, holds, listed)
		}
	}
}

func randomBlocks(rnd *rand.Rand, n int) []uint64 {
	p := make([]uint64, n)
	for i := range p {
		p[i] = rnd.Uint64()
	}
	return p
}

// TestPrefixScorerQueueMissCost checks that with queueMissCost a holder's
// queue costs, besides queueCostTokens per request, the prefill the pool's
// recent misses add per request queued ahead (its share of uncached tokens,
// as the servers reported, times the prompt's tokens per batch slot).
func TestPrefixScorerQueueMissCost(t *testing.T) {
	p := schedtest.Prompt("shared system prompt", 4096) // 1,024 tokens
	cases := []struct {
		name      string
		params    string
		missShare float64 // -1: no report yet
		want      float64 // pod 1's score, one request busier than the others
	}{
		{"off: queueCostTokens only", `{"queueCostTokens": 128}`, 0.5, 1 - 128.0/1024},
		{"on, no report yet", `{"queueCostTokens": 128, "queueMissCost": true}`, -1, 1 - 128.0/1024},
		{"on, the pool hits", `{"queueCostTokens": 128, "queueMissCost": true}`, 0, 1 - 128.0/1024},
		{"on, half the prompt tokens missed", `{"queueCostTokens": 128, "queueMissCost": true}`, 0.5, 1 - (128.0+512)/1024},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 3, c.params)
			f.score(p, 1)
			if c.missShare >= 0 {
				f.index().observeMiss(c.missShare)
			}
			e := f.tp.Ep(t, 1)
			e.AddInFlight(1)
			defer e.AddInFlight(-1)
			if got := f.score(p, 0)[1:]; !schedtest.ApproxEqual(got, []float64{c.want, 0, 0}) {
				t.Fatalf("scores %v, want [%v 0 0]", got, c.want)
			}
		})
	}
}

func TestPrefixScorerRendezvous(t *testing.T) {
	const params = `{"queueCostTokens": 128, "rendezvousBlocks": 4}`
	// Two replicas: each its own scorer (another hash seed) and its own
	// registry of the same pods.
	a, b := newPrefixFixture(t, 4, params), newPrefixFixture(t, 4, params)
	chosen := func(scores []float64) int {
		best := 0
		for pod, v := range scores {
			if v > 0 {
				if best != 0 {
					t.Fatalf("scores %v: more than one endpoint chosen", scores)
				}
				best = pod
			}
		}
		return best
	}
	pods := map[int]int{}
	for g := range 40 {
		p := schedtest.Prompt(fmt.Sprintf("system prompt %d", g), 2048)
		sa, sb := a.score(p, 0), b.score(p, 0)
		ca, cb := chosen(sa), chosen(sb)
		if ca == 0 || ca != cb || sa[ca] != RendezvousScore {
			t.Fatalf("prompt %d: replica A scores %v, B %v; want one endpoint scored %v, the same on both", g, sa, sb, RendezvousScore)
		}
		pods[ca]++
		// A different suffix after the same leading blocks is the same
		// choice; a different first block is another.
		q := append(append([]byte{}, p[:256]...), schedtest.Prompt("question", 500)...)
		if c := chosen(a.score(q, 0)); c != ca {
			t.Fatalf("prompt %d: a prompt of the same first 4 blocks chose pod %d, want %d", g, c, ca)
		}
	}
	if len(pods) != 4 {
		t.Fatalf("40 prefixes chose pods %v, want every pod", pods)
	}

	p := schedtest.Prompt("hot prefix", 2048)
	first := chosen(a.score(p, 0))
	// Bounded by load: the choice holds within one request of the least
	// loaded (the default slack), and moves, the same on both replicas,
	// beyond it.
	for _, f := range []*prefixFixture{a, b} {
		f.tp.Ep(t, first).AddInFlight(1)
	}
	if c := chosen(a.score(p, 0)); c != first {
		t.Fatalf("one request more on pod %d moved the choice to %d", first, c)
	}
	for _, f := range []*prefixFixture{a, b} {
		f.tp.Ep(t, first).AddInFlight(1)
	}
	second := chosen(a.score(p, 0))
	if second == first || second != chosen(b.score(p, 0)) {
		t.Fatalf("two more requests on pod %d: chosen %d on A, %d on B; want another pod, the same", first, second, chosen(b.score(p, 0)))
	}
	// A holder too loaded to be worth its cache spills where the other
	// replica, which does not know of the holder, sends the prefix.
	a.score(p, first)
	for _, f := range []*prefixFixture{a, b} {
		f.tp.Ep(t, first).AddInFlight(20)
	}
	if ca, cb := chosen(a.score(p, 0)), chosen(b.score(p, 0)); ca != cb || ca == first {
		t.Fatalf("holder %d overloaded: A chose %d, B %d", first, ca, cb)
	}
	// A holder worth its cache keeps the prefix; no rendezvous score.
	for _, f := range []*prefixFixture{a, b} {
		f.tp.Ep(t, first).AddInFlight(-22)
	}
	if s := a.score(p, 0); s[first] != 1 || chosen(s) != first {
		t.Fatalf("idle holder %d: scores %v", first, s)
	}

	// Off by default: a new prompt scores nothing.
	if s := newPrefixFixture(t, 4, `{"queueCostTokens": 128}`).score(p, 0); chosen(s) != 0 {
		t.Fatalf("without rendezvousBlocks: scores %v", s)
	}
}

func TestPrefixScorerRendezvousSlackPerReplica(t *testing.T) {
	const params = `{"queueCostTokens": 128, "rendezvousBlocks": 4, "rendezvousLoadSlack": 2, "rendezvousSlackPerReplica": true}`
	p := schedtest.Prompt("hot prefix", 2048)
	chosen := func(f *prefixFixture) int {
		for pod, v := range f.score(p, 0) {
			if v == RendezvousScore {
				return pod
			}
		}
		t.Fatal("no rendezvous choice")
		return 0
	}
	// load puts own requests in flight and a scrape of running requests
	// on each pod (1-based, pod 0 unused).
	load := func(f *prefixFixture, own, running []int) {
		for pod := 1; pod < len(own); pod++ {
			e := f.tp.Ep(t, pod)
			e.AddInFlight(int64(own[pod]) - e.InFlight())
			m := schedtest.Load(0, 0.1)
			m.RunningRequests = running[pod]
			e.SetMetrics(m)
		}
	}
	cases := []struct {
		name      string
		own, runs func(first int) []int
		replicas  int
		moved     bool
	}{{
		// The servers report what this replica sent: one replica, slack 2;
		// 3 more requests than the least loaded moves the choice.
		name:     "one replica",
		own:      func(first int) []int { v := make([]int, 5); v[first] = 3; return v },
		runs:     func(first int) []int { v := make([]int, 5); v[first] = 3; return v },
		replicas: 1, moved: true,
	}, {
		// The servers report twice what this replica has in flight: two
		// replicas, slack 4; the same 3 requests keep it.
		name: "two replicas",
		own:  func(first int) []int { v := make([]int, 5); v[first] = 2; return v },
		runs: func(first int) []int {
			v := make([]int, 5)
			v[first] = 3
			v[1+first%4] = 1
			return v
		},
		replicas: 2, moved: false,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 4, params)
			first := chosen(f)
			load(f, c.own(first), c.runs(first))
			got := chosen(f)
			if r := f.index().replicas(); r != c.replicas {
				t.Fatalf("estimated %d replicas, want %d", r, c.replicas)
			}
			if (got != first) != c.moved {
				t.Fatalf("choice %d, first %d: moved %v, want %v", got, first, got != first, c.moved)
			}
			load(f, make([]int, 5), make([]int, 5))
		})
	}
}

func TestLoadShareEstimate(t *testing.T) {
	cases := []struct {
		name    string
		samples [][2]int64 // own, scraped
		want    int
	}{
		{"no sample", nil, 1},
		{"nothing scraped", [][2]int64{{3, 0}}, 1},
		{"one replica, scrape lagging", [][2]int64{{5, 4}, {4, 4}}, 1},
		{"two replicas", [][2]int64{{3, 6}, {2, 4}, {4, 8}}, 2},
		{"three replicas", [][2]int64{{2, 6}, {3, 9}}, 3},
		{"none of the streams", [][2]int64{{0, 12}}, maxReplicaEstimate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newPrefixIndex(nil)
			for _, s := range c.samples {
				x.observeLoadShare(s[0], s[1])
			}
			if got := x.replicas(); got != c.want {
				t.Fatalf("replicas %d, want %d", got, c.want)
			}
		})
	}
}

// pickAndReport scores prompt, picks pod 1 and hands the scorer the
// server's report of it: cached of reported prompt tokens.
func (f *prefixFixture) pickAndReport(prompt []byte, cached, reported int) {
	f.t.Helper()
	cs := schedtest.NewCycle(f.tp.Pool, "m", 1)
	req := &framework.Request{Prompt: prompt}
	f.s.Score(ctx, cs, req, schedtest.Candidates(f.tp.Pool), make([]float64, len(f.tp.Pods)))
	res := &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(f.tp.Ep(f.t, 1))}}
	f.s.PostPick(ctx, cs, req, res)
	p := res.Prediction()
	if p.Observer == nil {
		f.t.Fatal("no prediction left")
	}
	p.ReportedPromptTokens = reported
	f.s.ObserveCachedTokens(&p, cached)
}

// TestObserveCachedTokensInServerTokens: the index predicts in its own
// estimate of tokens (4 prompt bytes a token), the server reports in its
// own; the report's prompt tokens scale the prediction, so a server whose
// tokens are 5 bytes long is not taken to have missed when it had every
// block. A prompt the index saw only the start of takes the pool's recent
// scale; without a report of prompt tokens the estimate stands; an absurd
// report counts as the bound.
func TestObserveCachedTokensInServerTokens(t *testing.T) {
	// 40 blocks of 64 bytes are hashed at most: 2,560 bytes.
	whole := schedtest.Prompt("whole", 1280) // 20 blocks, 320 tokens of 4 bytes, 256 of 5
	cut := schedtest.Prompt("cut", 3000)     // 40 blocks hashed, 2,560 bytes: 512 tokens of 5
	type report struct {
		prompt           []byte
		cached, reported int
	}
	cases := []struct {
		name string
		// before are reports of picks made first (their prompt recorded
		// once before each).
		before []report
		last   report
		// over is whether the last report counts as an over-prediction,
		// predicted the server's tokens the index predicted for it.
		over      bool
		predicted float64
	}{
		{name: "4 bytes a token, all cached", last: report{whole, 320, 320}, predicted: 320},
		{name: "5 bytes a token, all cached", last: report{whole, 256, 256}, predicted: 256},
		{name: "5 bytes a token, half cached", last: report{whole, 128, 256}, over: true, predicted: 256},
		{name: "a cut prompt takes the pool's scale", before: []report{{whole, 256, 256}}, last: report{cut, 512, 600}, predicted: 512},
		{name: "a cut prompt before any scale: the estimate", last: report{cut, 640, 750}, predicted: 640},
		{name: "no prompt tokens reported: the estimate", last: report{whole, 256, 0}, over: true, predicted: 320},
		{name: "an absurd report is bounded", last: report{whole, 0, 1 << 40}, over: true, predicted: 320 * maxTokenScale},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 2, `{"maxPrefixBlocksToMatch": 40}`)
			// run records r's prompt, picks it again (predicted whole) and
			// reports; it returns whether the report counted as an
			// over-prediction and the server's tokens predicted.
			run := func(r report) (bool, float64) {
				f.score(r.prompt, 1)
				over, predicted := testutil.ToFloat64(f.s.agreement.overPredicted), testutil.ToFloat64(f.s.agreement.predictedTokens)
				f.pickAndReport(r.prompt, r.cached, r.reported)
				return testutil.ToFloat64(f.s.agreement.overPredicted) > over, testutil.ToFloat64(f.s.agreement.predictedTokens) - predicted
			}
			for _, r := range c.before {
				if over, _ := run(r); over {
					t.Fatal("a report before the last counted as an over-prediction")
				}
			}
			over, predicted := run(c.last)
			if over != c.over || predicted != c.predicted {
				t.Fatalf("over-predicted %v, %v server tokens predicted; want %v, %v", over, predicted, c.over, c.predicted)
			}
		})
	}
}

// TestPrefixScorerRendezvousBalanceCache places 24 new prefixes on 4
// servers from two replicas: they agree on each, and the bound keeps the
// servers' counts close (rendezvousBalanceCache: within 2 of each other;
// rendezvousBalanceEven: within 1, and on unequal caches in proportion to
// them, the server of twice the others' cache taking twice their share;
// rendezvousBalanceNewPrefix: the first four on four servers, where the
// looser bound puts two of them on one, then within 2).
func TestPrefixScorerRendezvousBalanceCache(t *testing.T) {
	const loose = `{"queueCostTokens": 128, "rendezvousBlocks": 4, "rendezvousLoadSlack": 8, "rendezvousBalanceCache": true`
	cases := []struct {
		name   string
		params string
		blocks [5]int    // each pod's KV-cache blocks (0: not scraped)
		want   [5][2]int // each pod's least and most prefixes
		// firstFour is how many pods the first four prefixes land on:
		// 3 where the looser bound lets a second join the first.
		firstFour int
	}{
		{"within two", loose + "}", [5]int{}, [5][2]int{{}, {5, 7}, {5, 7}, {5, 7}, {5, 7}}, 3},
		{"even", loose + `, "rendezvousBalanceEven": true}`, [5]int{}, [5][2]int{{}, {6, 6}, {6, 6}, {6, 6}, {6, 6}}, 4},
		{"new prefix to an empty server first", loose + `, "rendezvousBalanceNewPrefix": true}`, [5]int{}, [5][2]int{{}, {5, 7}, {5, 7}, {5, 7}, {5, 7}}, 4},
		{"even, unequal caches", loose + `, "rendezvousBalanceEven": true}`, [5]int{0, 400, 200, 200, 200}, [5][2]int{{}, {10, 14}, {3, 5}, {3, 5}, {3, 5}}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPrefixFixture(t, 4, tc.params), newPrefixFixture(t, 4, tc.params)
			for pod := 1; pod <= 4; pod++ {
				if tc.blocks[pod] > 0 {
					for _, f := range []*prefixFixture{a, b} {
						m := schedtest.Load(0, 0.1)
						m.NumBlocks, m.BlockSize = tc.blocks[pod], 16
						f.tp.Ep(t, pod).SetMetrics(m)
					}
				}
			}
			chosen := func(scores []float64) int {
				for pod, v := range scores {
					if v == RendezvousScore {
						return pod
					}
				}
				t.Fatalf("scores %v: no rendezvous choice", scores)
				return 0
			}
			count := map[int]int{}
			for g := range 24 {
				if g == 4 && len(count) != tc.firstFour {
					t.Fatalf("the first four prefixes on %d pods %v, want %d", len(count), count, tc.firstFour)
				}
				p := schedtest.Prompt(fmt.Sprintf("system prompt %d", g), 2048)
				ca, cb := chosen(a.score(p, 0)), chosen(b.score(p, 0))
				if ca != cb {
					t.Fatalf("prompt %d: replica A chose pod %d, B pod %d", g, ca, cb)
				}
				a.score(p, ca)
				b.score(p, cb)
				count[ca]++
			}
			for pod := 1; pod <= 4; pod++ {
				if n := count[pod]; n < tc.want[pod][0] || n > tc.want[pod][1] {
					t.Fatalf("prefixes per pod %v: pod %d has %d, want %d to %d", count, pod, n, tc.want[pod][0], tc.want[pod][1])
				}
			}
		})
	}
}

// TestPrefixScorerRendezvousByCacheSize places many new prefixes on
// servers of unequal caches (4, 2, 1 and 2 parts): each gets new prefixes
// in proportion to its cache, within a generous band, where the hash alone
// (the weighing off) gives each about a quarter; servers whose cache size
// is unknown weigh as the mean of the known.
func TestPrefixScorerRendezvousByCacheSize(t *testing.T) {
	const prefixes = 2000
	cases := []struct {
		name   string
		params string
		blocks []int // per pod (1-based; 0: no cache info scraped)
		want   []float64
	}{
		{"weighed", "", []int{0, 400, 200, 100, 200}, []float64{0, 4.0 / 9, 2.0 / 9, 1.0 / 9, 2.0 / 9}},
		{"off", `"rendezvousByCacheSize": false, `, []int{0, 400, 200, 100, 200}, []float64{0, 0.25, 0.25, 0.25, 0.25}},
		{"unknown weigh the mean", "", []int{0, 400, 200, 0, 0}, []float64{0, 4.0 / 12, 2.0 / 12, 3.0 / 12, 3.0 / 12}},
		{"equal", "", []int{0, 300, 300, 300, 300}, []float64{0, 0.25, 0.25, 0.25, 0.25}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 4, `{`+c.params+`"queueCostTokens": 128, "rendezvousBlocks": 4, "rendezvousLoadSlack": 8}`)
			for pod := 1; pod <= 4; pod++ {
				m := schedtest.Load(0, 0.1)
				m.NumBlocks, m.BlockSize = c.blocks[pod], 16
				// Fresh however long the 2,000 picks take on a loaded
				// machine: stale metrics have no cache size.
				m.ScrapedAt = m.ScrapedAt.Add(time.Hour)
				f.tp.Ep(t, pod).SetMetrics(m)
			}
			got := make([]float64, 5)
			for g := range prefixes {
				for pod, v := range f.score(schedtest.Prompt(fmt.Sprintf("system prompt %d", g), 512), 0) {
					if v == RendezvousScore {
						got[pod]++
					}
				}
			}
			for pod := 1; pod <= 4; pod++ {
				share := got[pod] / prefixes
				if math.Abs(share-c.want[pod]) > 0.04 {
					t.Errorf("pod %d chosen for %.3f of new prefixes, want %.3f (all: %v)", pod, share, c.want[pod], got)
				}
			}
		})
	}
}

// TestPrefixScorerLoadPerCacheSize: a holder of half the candidates' mean
// KV cache counts each request in flight twice in queueCostTokens' rule
// (loadPerCacheSize), once with the weighing off; a holder of twice the
// mean cache, half.
func TestPrefixScorerLoadPerCacheSize(t *testing.T) {
	p := schedtest.Prompt("shared system prompt", 4096) // 1,024 tokens
	cases := []struct {
		name   string
		params string
		blocks [4]int // by pod; the mean of pods 1-3
		want   float64
	}{
		{"half the mean cache", "", [4]int{0, 100, 200, 300}, 1 - 4*128.0/1024},
		{"half the mean cache, off", `, "loadPerCacheSize": false`, [4]int{0, 100, 200, 300}, 1 - 2*128.0/1024},
		{"twice the mean cache", "", [4]int{0, 400, 100, 100}, 1 - 1*128.0/1024},
		{"equal caches", "", [4]int{0, 200, 200, 200}, 1 - 2*128.0/1024},
		{"unknown caches", "", [4]int{0, 0, 0, 0}, 1 - 2*128.0/1024},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 3, `{"queueCostTokens": 128`+c.params+`}`)
			for pod := 1; pod <= 3; pod++ {
				m := schedtest.Load(0, 0.1)
				m.NumBlocks, m.BlockSize = c.blocks[pod], 16
				f.tp.Ep(t, pod).SetMetrics(m)
			}
			f.score(p, 1)
			e := f.tp.Ep(t, 1)
			e.AddInFlight(2)
			defer e.AddInFlight(-2)
			if got := f.score(p, 0)[1]; !schedtest.ApproxEqual([]float64{got}, []float64{c.want}) {
				t.Fatalf("holder scores %v, want %v", got, c.want)
			}
		})
	}
}

// TestPrefixScorerQueueCostWithRoom: while the candidates' live blocks
// (found again by a later prompt) fill at most 40 % of their LRUs, a
// holder's extra request costs queueCostTokensWithRoom; past it, or with
// the parameter unset, queueCostTokens. A prompt recorded once is not
// live however much room it takes.
func TestPrefixScorerQueueCostWithRoom(t *testing.T) {
	p := schedtest.Prompt("shared system prompt", 4096) // 64 blocks, 1,024 tokens
	q := schedtest.Prompt("another system prompt", 4096)
	cases := []struct {
		name   string
		params string
		lru    int // blocks per endpoint, 3 endpoints
		qPicks int // times q is recorded on pod 2
		want   float64
	}{
		{"unset: queueCostTokens", `{"queueCostTokens": 128, "lruCapacityPerServer": 100}`, 100, 2, 1 - 128.0/1024},
		{"room: 64 live of 300", `{"queueCostTokens": 128, "queueCostTokensWithRoom": 256, "lruCapacityPerServer": 100}`, 100, 0, 1 - 256.0/1024},
		{"a prompt seen once is not live: 64 of 300", `{"queueCostTokens": 128, "queueCostTokensWithRoom": 256, "lruCapacityPerServer": 100}`, 100, 1, 1 - 256.0/1024},
		{"pressure: 128 live of 300", `{"queueCostTokens": 128, "queueCostTokensWithRoom": 256, "lruCapacityPerServer": 100}`, 100, 2, 1 - 128.0/1024},
		{"room again in larger caches: 128 live of 600", `{"queueCostTokens": 128, "queueCostTokensWithRoom": 256, "lruCapacityPerServer": 200}`, 200, 2, 1 - 256.0/1024},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPrefixFixture(t, 3, c.params)
			f.score(p, 1)
			f.score(p, 1) // found again: live
			for range c.qPicks {
				f.score(q, 2)
			}
			e := f.tp.Ep(t, 1)
			e.AddInFlight(1)
			defer e.AddInFlight(-1)
			if got := f.score(p, 0)[1]; !schedtest.ApproxEqual([]float64{got}, []float64{c.want}) {
				t.Fatalf("holder scores %v, want %v", got, c.want)
			}
		})
	}
}

// TestPrefixScorerRendezvousNeedsRoom: with rendezvousNeedsRoom, the
// rendezvous choice passes over a server whose load reaches the most
// sequences a server was seen running while another within the slack
// has a free one, the same on two replicas; with none free, or the
// parameter off, the slack alone bounds it.
func TestPrefixScorerRendezvousNeedsRoom(t *testing.T) {
	const params = `{"queueCostTokens": 128, "rendezvousBlocks": 4, "rendezvousLoadSlack": 8`
	p := schedtest.Prompt("new system prompt", 2048)
	cases := []struct {
		name      string
		needsRoom bool
		// seen is the most sequences a server was seen running before;
		// then running and waiting on the chosen server, running on the
		// others (every one seen by a scrape), and the chosen server's
		// own requests in flight.
		seen, running, waiting, othersRunning, inFlight int
		// held: the chosen server holds the prompt, too loaded to be
		// worth its cache.
		held, wantMoved bool
	}{
		{"full and queueing: moved", true, 4, 4, 2, 2, 0, false, true},
		{"full: moved", true, 4, 4, 0, 3, 0, false, true},
		{"a sequence free: kept", true, 4, 3, 0, 0, 0, false, false},
		{"full by its own requests since the scrape: moved", true, 4, 3, 0, 2, 4, false, true},
		{"held by a holder too loaded for its cache: kept", true, 4, 4, 7, 3, 0, true, false},
		{"not held, the same load: moved", true, 4, 4, 7, 3, 0, false, true},
		{"the most seen running: moved", true, 0, 3, 0, 2, 0, false, true},
		{"every server full: kept", true, 4, 4, 1, 4, 0, false, false},
		{"off: kept within the slack", false, 4, 4, 2, 2, 0, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			room := ""
			if c.needsRoom {
				room = `, "rendezvousNeedsRoom": true`
			}
			a, b := newPrefixFixture(t, 4, params+room+"}"), newPrefixFixture(t, 4, params+room+"}")
			first := rendezvousChoice(t, a.score(p, 0))
			load := func(running, waiting, othersRunning, inFlight int) {
				for _, f := range []*prefixFixture{a, b} {
					for pod := 1; pod <= 4; pod++ {
						m := schedtest.Load(0, 0.1)
						m.RunningRequests = othersRunning
						if pod == first {
							m.RunningRequests, m.WaitingRequests = running, waiting
							f.tp.Ep(t, pod).AddInFlight(int64(inFlight))
						}
						f.tp.Ep(t, pod).SetMetrics(m)
					}
				}
			}
			load(c.seen, 0, c.seen, 0)
			if ca, cb := rendezvousChoice(t, a.score(p, 0)), rendezvousChoice(t, b.score(p, 0)); ca != first || cb != first {
				t.Fatalf("every server at %d running: chose pods %d and %d, want %d", c.seen, ca, cb, first)
			}
			if c.held {
				for _, f := range []*prefixFixture{a, b} {
					f.score(p, first)
				}
			}
			load(c.running, c.waiting, c.othersRunning, c.inFlight)
			ca, cb := rendezvousChoice(t, a.score(p, 0)), rendezvousChoice(t, b.score(p, 0))
			if ca != cb {
				t.Fatalf("replica A chose pod %d, B pod %d", ca, cb)
			}
			if moved := ca != first; moved != c.wantMoved {
				t.Fatalf("chose pod %d, first choice %d: moved %v, want %v", ca, first, moved, c.wantMoved)
			}
		})
	}
}

// rendezvousChoice is the one pod scored RendezvousScore.
func rendezvousChoice(t *testing.T, scores []float64) int {
	t.Helper()
	chosen := 0
	for pod, v := range scores {
		switch {
		case v == RendezvousScore && chosen == 0:
			chosen = pod
		case v != 0:
			t.Fatalf("scores %v: want one pod scored %v, the others 0", scores, RendezvousScore)
		}
	}
	if chosen == 0 {
		t.Fatalf("scores %v: no rendezvous choice", scores)
	}
	return chosen
}
