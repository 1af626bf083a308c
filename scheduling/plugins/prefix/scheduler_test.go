// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// The scheduler's pool and endpoint changes reach the prefix-cache
// scorer's index: what a pool or endpoint that left kept is dropped.

// schedulerWithScorer is a scheduler of the default config whose
// prefix-cache scorer the test holds.
func schedulerWithScorer(t *testing.T) (*scheduling.Scheduler, *prefix.Scorer) {
	t.Helper()
	var ps *prefix.Scorer
	r := scheduling.NewRegistry()
	if err := r.Register("held-prefix-cache-scorer", func(name string, raw json.RawMessage, h framework.Handle) (framework.Plugin, error) {
		p, err := prefix.New(name, raw, h)
		if err == nil {
			ps = p.(*prefix.Scorer)
		}
		return p, err
	}); err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(scheduling.DefaultConfigText, "- type: prefix-cache-scorer\n", "- type: held-prefix-cache-scorer\n  name: prefix-cache-scorer\n", 1)
	s, err := scheduling.New(nil, scheduling.Options{Registry: r, ConfigText: cfg, Rand: schedtest.SeededRand(1)})
	if err != nil {
		t.Fatal(err)
	}
	if ps == nil {
		t.Fatal("the config built no prefix-cache scorer")
	}
	return s, ps
}

// schedule picks and runs the post-pick step at once.
func schedule(s *scheduling.Scheduler, pool *datastore.Pool, req *scheduling.Request) (*scheduling.Result, error) {
	res, err := s.ScheduleDeferred(context.Background(), pool, req)
	res.Commit()
	return res, err
}

func TestSchedulePodLeavingMidTraffic(t *testing.T) {
	s, ps := schedulerWithScorer(t)
	tp := schedtest.NewPool(t, 6, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	leaving := tp.Ep(t, 1)
	// Make the leaving pod the favourite: lightest load and the prefix.
	leaving.SetMetrics(schedtest.Load(0, 0))
	p := schedtest.Prompt("shared", 2048)

	var removed atomic.Bool
	var after atomic.Int64
	const wantAfter = 2000
	started, enough := make(chan struct{}), make(chan struct{})
	var startOnce, enoughOnce sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				gone := removed.Load()
				res, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
				if err != nil {
					errs <- err
					return
				}
				startOnce.Do(func() { close(started) })
				if !gone {
					continue
				}
				if after.Add(1) == wantAfter {
					enoughOnce.Do(func() { close(enough) })
				}
				for _, e := range res.Endpoints {
					if e.Key() == leaving.Key() {
						errs <- errors.New("removed endpoint " + e.Address + " picked after SetPods returned")
						return
					}
				}
			}
		}()
	}
	finish := func() {
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	timeout := time.After(30 * time.Second)
	select {
	case <-started:
	case <-timeout:
		finish()
		t.Fatal("no request was scheduled")
	}
	// Remove the pod while traffic flows.
	tp.Pool.SetPods(tp.Pods[1:])
	removed.Store(true)
	select {
	case <-enough:
	case err := <-errs:
		errs <- err
	case <-timeout:
	}
	finish()
	if after.Load() == 0 {
		t.Fatal("no request was scheduled after the removal")
	}
	// The prefix state of the departed endpoint is gone too.
	if ps.Holds(dsview.Pool(tp.Pool), dsview.Endpoint(leaving)) {
		t.Fatal("prefix index still holds blocks of the removed endpoint")
	}
}

func TestSchedulePrefixStateDroppedWithPool(t *testing.T) {
	s, ps := schedulerWithScorer(t)
	tp := schedtest.NewPool(t, 3, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	if _, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: schedtest.Prompt("x", 1024)}); err != nil {
		t.Fatal(err)
	}
	if got := ps.IndexedBlocks(dsview.Pool(tp.Pool)); got != 16 {
		t.Fatalf("index holds %d blocks, want 16 (1 KB / 64 B)", got)
	}
	tp.Reg.Remove(tp.Pool.Key)
	if got := ps.IndexedPools(); got != 0 {
		t.Fatalf("%d pool indexes left after the pool was removed", got)
	}
	// A late request for the removed pool leaves nothing behind.
	if _, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: schedtest.Prompt("x", 1024)}); err != nil {
		t.Fatal(err)
	}
	if got := ps.IndexedPools(); got != 0 {
		t.Fatalf("%d pool indexes after a late request for a removed pool", got)
	}
}

// TestSchedulePoolsAreIndependent schedules on two pools at once while one
// is removed: the other keeps its prefix state and keeps serving.
func TestSchedulePoolsAreIndependent(t *testing.T) {
	s, ps := schedulerWithScorer(t)
	reg := datastore.NewRegistry()
	reg.AddObserver(s)
	mk := func(name string) *datastore.Pool {
		p := reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: name}, &datastore.PoolSpec{TargetPorts: []int32{8000}})
		var pods []datastore.EndpointSource
		for i := 1; i <= 4; i++ {
			src := schedtest.PodSource(i)
			src.UID += types.UID(name)
			pods = append(pods, src)
		}
		p.SetPods(pods)
		for _, e := range p.Endpoints().Endpoints {
			e.SetMetrics(schedtest.Load(0, 0.1))
		}
		return p
	}
	a, b := mk("a"), mk("b")
	p := schedtest.Prompt("same prompt in both pools", 1024)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, pool := range []*datastore.Pool{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if _, err := schedule(s, pool, &scheduling.Request{Model: "m", Prompt: p}); err != nil && pool == b {
					errs <- err
					return
				}
			}
		}()
	}
	reg.Remove(a.Key)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := ps.IndexedBlocks(dsview.Pool(a)); n != 0 {
		t.Fatalf("removed pool still indexes %d blocks", n)
	}
	if n := ps.IndexedBlocks(dsview.Pool(b)); n != 16 {
		t.Fatalf("pool b indexes %d blocks, want 16", n)
	}
	// Pool a keeps answering (its last snapshot) without growing state.
	if _, err := schedule(s, a, &scheduling.Request{Model: "m", Prompt: p}); err != nil {
		t.Fatal(err)
	}
	if n := ps.IndexedPools(); n != 1 {
		t.Fatalf("%d pool indexes, want 1", n)
	}
}

// TestScheduleDeferredLearnsAtCommit: ScheduleDeferred picks like Schedule
// but the prefix index learns nothing until Commit, which learns once; a
// result never committed leaves the index as it was.
func TestScheduleDeferredLearnsAtCommit(t *testing.T) {
	s, ps := schedulerWithScorer(t)
	tp := schedtest.NewPool(t, 3, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	p := schedtest.Prompt("deferred", 1024)

	dropped, err := s.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped.Endpoints) == 0 {
		t.Fatal("no endpoint picked")
	}
	if got := ps.IndexedBlocks(dsview.Pool(tp.Pool)); got != 0 {
		t.Fatalf("index holds %d blocks before any commit, want 0", got)
	}

	res, err := s.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
	if err != nil {
		t.Fatal(err)
	}
	res.Commit()
	if got := ps.IndexedBlocks(dsview.Pool(tp.Pool)); got != 16 {
		t.Fatalf("index holds %d blocks after commit, want 16 (1 KB / 64 B)", got)
	}
	if !ps.Holds(dsview.Pool(tp.Pool), dsview.Endpoint(res.Endpoints[0])) {
		t.Fatalf("the primary %s did not learn the prompt", res.Endpoints[0].Address)
	}
	res.Commit() // a second commit is a no-op
	if got := ps.IndexedBlocks(dsview.Pool(tp.Pool)); got != 16 {
		t.Fatalf("index holds %d blocks after a second commit, want 16", got)
	}
	// The learned prefix draws the next pick, as after Schedule.
	again, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
	if err != nil {
		t.Fatal(err)
	}
	if again.Endpoints[0] != res.Endpoints[0] {
		t.Fatalf("the next pick went to %s, want the primary that learned the prefix, %s", again.Endpoints[0].Address, res.Endpoints[0].Address)
	}

	var none *scheduling.Result
	none.Commit() // nil-safe, as after an error
}

// linkedPeers hands one scheduler's shared blocks to another's
// LearnPeerBlocks at once, as package peersync does over a stream.
type linkedPeers struct {
	key    uint64
	to     *scheduling.Scheduler
	pool   *datastore.Pool
	shared atomic.Int64
	forgot atomic.Int64
}

func (l *linkedPeers) HashKey() uint64 { return l.key }

func (l *linkedPeers) ShareBlocks(_ framework.Pool, e framework.Endpoint, blocks []uint64) {
	l.shared.Add(1)
	if l.to == nil {
		return
	}
	if de, ok := l.pool.Endpoints().Get(e.Address()); ok {
		l.to.LearnPeerBlocks(l.pool, de, blocks)
	}
}

func (l *linkedPeers) ForgetBlocks(_ framework.Pool, e framework.Endpoint, blocks []uint64) {
	l.forgot.Add(1)
	if l.to == nil {
		return
	}
	if de, ok := l.pool.Endpoints().Get(e.Address()); ok {
		l.to.ForgetPeerBlocks(l.pool, de, blocks)
	}
}

// TestSchedulePeerBlocks: with peers, a replica that never saw a prompt
// sends it where a peer's pick cached it; without peers (a replica of
// its own) it chooses elsewhere.
func TestSchedulePeerBlocks(t *testing.T) {
	toB := &linkedPeers{key: 42}
	toA := &linkedPeers{key: 42}
	a, err := scheduling.New(nil, scheduling.Options{Rand: schedtest.SeededRand(1), Peers: toB})
	if err != nil {
		t.Fatal(err)
	}
	b, err := scheduling.New(nil, scheduling.Options{Rand: schedtest.SeededRand(2), Peers: toA})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := scheduling.New(nil, scheduling.Options{Rand: schedtest.SeededRand(2)})
	if err != nil {
		t.Fatal(err)
	}
	tp := schedtest.NewPool(t, 4, a, b, alone)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	toB.to, toB.pool, toA.to, toA.pool = b, tp.Pool, a, tp.Pool
	p := schedtest.Prompt("peer", 4096)

	res, err := schedule(alone, tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := res.Endpoints[0].Address
	var target string
	for _, e := range tp.Pool.Endpoints().Endpoints {
		if e.Address != elsewhere {
			target = e.Address
			break
		}
	}
	// A picks target (the subset leaves no other) and shares the blocks.
	if _, err := schedule(a, tp.Pool, &scheduling.Request{Model: "m", Prompt: p, Subset: []string{target}}); err != nil {
		t.Fatal(err)
	}
	if toB.shared.Load() != 1 {
		t.Fatalf("%d picks shared, want 1", toB.shared.Load())
	}
	for _, tc := range []struct {
		name string
		s    *scheduling.Scheduler
		want string
	}{{"peer", b, target}, {"alone", alone, elsewhere}} {
		res, err := schedule(tc.s, tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Endpoints[0].Address; got != tc.want {
			t.Errorf("%s: picked %s, want %s", tc.name, got, tc.want)
		}
	}
	// B's own pick went to A in turn: the blocks travel both ways.
	if toA.shared.Load() != 1 {
		t.Fatalf("B shared %d picks, want 1", toA.shared.Load())
	}
}

// TestSchedulePeerForgets: when a server reports fewer cached tokens than
// replica A's index predicted, A forgets what its server evicted, and so
// does its peer B, which saw the same picks: B no longer sends the evicted
// prefix to that server for its cache. Without usage feedback neither
// forgets; a report that confirms the prediction forgets nothing.
func TestSchedulePeerForgets(t *testing.T) {
	prefixOnly := func(feedback bool) string {
		return fmt.Sprintf(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    usageFeedback: %t
- type: max-score-picker
`, feedback)
	}
	cases := []struct {
		name     string
		feedback bool
		// cached is what the server reports of p1's second pick, whose 10
		// blocks (160 tokens) were predicted.
		cached int
		// p0Held is whether each replica still sends p0 to the server.
		p0Held bool
		forgot int64
	}{
		{name: "a miss", feedback: true, cached: 0, p0Held: false, forgot: 1},
		{name: "a miss without usage feedback", feedback: false, cached: 0, p0Held: true, forgot: 0},
		{name: "a hit", feedback: true, cached: 160, p0Held: true, forgot: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			toB, toA := &linkedPeers{key: 9}, &linkedPeers{key: 9}
			a, err := scheduling.New(nil, scheduling.Options{ConfigText: prefixOnly(c.feedback), Rand: schedtest.SeededRand(1), Peers: toB})
			if err != nil {
				t.Fatal(err)
			}
			b, err := scheduling.New(nil, scheduling.Options{ConfigText: prefixOnly(c.feedback), Rand: schedtest.SeededRand(2), Peers: toA})
			if err != nil {
				t.Fatal(err)
			}
			tp := schedtest.NewPool(t, 2, a, b)
			tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
			toB.to, toB.pool, toA.to, toA.pool = b, tp.Pool, a, tp.Pool
			server := tp.Ep(t, 1).Address
			p := []([]byte){schedtest.Prompt("p0", 640), schedtest.Prompt("p1", 640), schedtest.Prompt("p2", 640)}
			for _, prompt := range p {
				if _, err := schedule(a, tp.Pool, &scheduling.Request{Model: "m", Prompt: prompt, Subset: []string{server}}); err != nil {
					t.Fatal(err)
				}
			}
			// p1 again, predicted whole; the report says what the server had
			// (a miss: p0, used before p1, is gone; p2, used since, stays).
			res, err := a.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: p[1], Subset: []string{server}})
			if err != nil {
				t.Fatal(err)
			}
			res.Commit()
			res.ObserveResponse(c.cached, 160, 0)
			if got := toB.forgot.Load(); got != c.forgot {
				t.Fatalf("A made its peer forget %d times, want %d", got, c.forgot)
			}
			for _, r := range []struct {
				name string
				s    *scheduling.Scheduler
			}{{"A", a}, {"B", b}} {
				for i, prompt := range p {
					// Not committed: the check learns nothing.
					res, err := r.s.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: prompt, Scores: true})
					if err != nil {
						t.Fatal(err)
					}
					held := res.Scores[server] > res.Scores[tp.Ep(t, 2).Address]
					if want := i > 0 || c.p0Held; held != want {
						t.Errorf("%s: p%d scores %v, the server held it: %v, want %v", r.name, i, res.Scores, held, want)
					}
				}
			}
		})
	}
}

// TestScheduleQueueCostFromServersUnequalCaches: on servers of unequal KV
// caches the scorer counts a holder's load per its share of the pool's
// mean cache (loadPerCacheSize), and the fit learns the cost of that
// load, not of a raw request: a holder of half the other's cache (a
// weight of 1.5), whose requests ahead cost 100 ms each, keeps a 400-token
// prefix while its extra requests cost less than the prefill (3: 300 ms),
// and gives way beyond (5: 500 ms). Fitting raw requests would charge 1.5
// times what they cost, and the holder would give way at 3.
func TestScheduleQueueCostFromServersUnequalCaches(t *testing.T) {
	config := queueCostConfig("queueCostFromServers: true")
	loaded := func(waiting, blocks int) *datastore.Metrics {
		m := schedtest.Load(waiting, 0.1)
		m.BlockSize, m.NumBlocks = 16, blocks
		return m
	}
	for _, c := range []struct {
		busier int
		held   bool
	}{{busier: 3, held: true}, {busier: 5, held: false}} {
		t.Run(fmt.Sprint("holder busier by ", c.busier), func(t *testing.T) {
			// The responses are the holder's, at loads 0-7.
			holdUnderLoad{config: config, responses: 64, loads: 8, teachHolder: true,
				metrics: func(ahead int) *datastore.Metrics { return loaded(ahead, 500) },
				ttft: func(ahead, uncached int) time.Duration {
					return 30*time.Millisecond + time.Duration(uncached)*time.Millisecond + time.Duration(ahead)*100*time.Millisecond
				},
				holder: loaded(c.busier, 500), other: loaded(0, 1000),
			}.check(t, c.held)
		})
	}
}

// TestScheduleQueueCostFromServers: with queueCostFromServers, what a
// holder's extra load costs against its cached prefix is what the
// servers' responses show (their TTFT against their uncached tokens and
// the requests ahead at the pick), not queueCostTokens: a holder of a
// 400-token prefix, W requests busier than the other server, keeps the
// prompt while W requests ahead cost less than the prefix's prefill.
func TestScheduleQueueCostFromServers(t *testing.T) {
	config := func(learn bool) string { return queueCostConfig(fmt.Sprint("queueCostFromServers: ", learn)) }
	cases := []struct {
		name  string
		learn bool
		// perRequest is what a request ahead adds to the responses' TTFT
		// (a token of prefill takes 1ms); streamed says whether they
		// were streamed (a TTFT reported); none: no responses.
		perRequest time.Duration
		streamed   bool
		// busier is the holder's extra load; held, whether it keeps the
		// prompt.
		busier int
		held   bool
	}{
		{name: "no responses: 192 tokens a request", learn: true, busier: 2, held: true},
		{name: "no responses: 192 tokens a request, busier", learn: true, busier: 3, held: false},
		{name: "a request ahead costs 10 tokens", learn: true, perRequest: 10 * time.Millisecond, streamed: true, busier: 30, held: true},
		{name: "a request ahead costs 1,000 tokens", learn: true, perRequest: time.Second, streamed: true, busier: 1, held: false},
		{name: "responses not streamed: 192 tokens", learn: true, perRequest: 10 * time.Millisecond, streamed: false, busier: 3, held: false},
		{name: "off: 192 tokens whatever the servers show", learn: false, perRequest: 10 * time.Millisecond, streamed: true, busier: 3, held: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := holdUnderLoad{config: config(c.learn), loads: 8,
				metrics: func(ahead int) *datastore.Metrics { return schedtest.Load(ahead, 0.1) },
				ttft: func(ahead, uncached int) time.Duration {
					if !c.streamed {
						return 0
					}
					return 30*time.Millisecond + time.Duration(uncached)*time.Millisecond + time.Duration(ahead)*c.perRequest
				},
				holder: schedtest.Load(c.busier, 0.1), other: schedtest.Load(0, 0.1),
			}
			if c.perRequest > 0 {
				h.responses = 64
			}
			h.check(t, c.held)
		})
	}
}

// TestScheduleQueueCostBeyondBatch: with queueCostBeyondBatch the fit
// tells a request ahead within the batch (28 ms, sharing the batch) from
// one beyond it (300 ms more, waiting for a sequence), as the servers'
// responses show, and a holder of a 400-token prefix keeps it while its
// extra load fits in the batch (4 requests: 112 ms) and gives way to a
// queue (6: 2 beyond the batch). One slope over both charges about 180
// tokens a request, and the holder gives way at 4.
func TestScheduleQueueCostBeyondBatch(t *testing.T) {
	config := func(beyond bool) string {
		return queueCostConfig("queueCostFromServers: true", fmt.Sprint("queueCostBeyondBatch: ", beyond))
	}
	const batch = 4
	loaded := func(ahead int) *datastore.Metrics {
		m := schedtest.Load(max(ahead-batch, 0), 0.1)
		m.RunningRequests = min(ahead, batch)
		return m
	}
	for _, c := range []struct {
		beyond bool
		busier int
		held   bool
	}{
		{beyond: true, busier: 2, held: true},
		{beyond: true, busier: 4, held: true},
		{beyond: true, busier: 6, held: false},
		{beyond: false, busier: 2, held: true},
		{beyond: false, busier: 4, held: false},
	} {
		t.Run(fmt.Sprintf("beyond the batch %v, holder busier by %d", c.beyond, c.busier), func(t *testing.T) {
			holdUnderLoad{config: config(c.beyond), responses: 90, loads: 9, metrics: loaded,
				ttft: func(ahead, uncached int) time.Duration {
					return 30*time.Millisecond + time.Duration(uncached)*time.Millisecond +
						time.Duration(ahead)*28*time.Millisecond + time.Duration(max(ahead-batch, 0))*300*time.Millisecond
				},
				holder: loaded(c.busier), other: loaded(0),
			}.check(t, c.held)
		})
	}
}

// holdUnderLoad is a two-server pool asked whether the holder of a
// 400-token prefix (25 blocks) keeps it at a load. The scheduler of
// config first has responses responses of other prompts, on the other
// server or, with teachHolder, on the holder: the i-th at ahead = i%loads
// requests ahead (the server's metrics(ahead)), with up to 400 of its
// tokens uncached and the TTFT ttft(ahead, uncached). Then the prefix is
// placed on the holder and the prompt checked, uncommitted, with the
// servers' metrics holder and other.
type holdUnderLoad struct {
	config           string
	responses, loads int
	teachHolder      bool
	metrics          func(ahead int) *datastore.Metrics
	ttft             func(ahead, uncached int) time.Duration
	holder, other    *datastore.Metrics
}

// check fails t unless whether the holder keeps the prompt is held.
func (h holdUnderLoad) check(t *testing.T, held bool) {
	t.Helper()
	s, err := scheduling.New(nil, scheduling.Options{ConfigText: h.config, Rand: schedtest.SeededRand(1)})
	if err != nil {
		t.Fatal(err)
	}
	tp := schedtest.NewPool(t, 2, s)
	holder, other := tp.Ep(t, 1), tp.Ep(t, 2)
	other.SetMetrics(h.other)
	teacher := other
	if h.teachHolder {
		teacher = holder
	}
	for i := range h.responses {
		ahead, uncached := i%h.loads, (i*37)%401
		teacher.SetMetrics(h.metrics(ahead))
		res, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: schedtest.Prompt(fmt.Sprint("q", i), 1600), Subset: []string{teacher.Address}})
		if err != nil {
			t.Fatal(err)
		}
		res.ObserveResponse(400-uncached, 400, h.ttft(ahead, uncached))
	}
	p := schedtest.Prompt("p", 1600)
	if _, err := schedule(s, tp.Pool, &scheduling.Request{Model: "m", Prompt: p, Subset: []string{holder.Address}}); err != nil {
		t.Fatal(err)
	}
	holder.SetMetrics(h.holder)
	other.SetMetrics(h.other)
	// Not committed: the check learns nothing.
	res, err := s.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: p, Scores: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Scores[holder.Address] > res.Scores[other.Address]; got != held {
		t.Fatalf("scores %v: the holder kept the prompt %v, want %v", res.Scores, got, held)
	}
}

// queueCostConfig is a config of the prefix scorer alone, its holders'
// load weighed at queueCostTokens 192 and no usage feedback, with params
// (lines of YAML) among its parameters.
func queueCostConfig(params ...string) string {
	var b strings.Builder
	b.WriteString("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n" +
		"- type: prefix-cache-scorer\n  parameters:\n    queueCostTokens: 192\n    usageFeedback: false\n")
	for _, p := range params {
		b.WriteString("    " + p + "\n")
	}
	b.WriteString("- type: max-score-picker\n")
	return b.String()
}
