// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
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
	if ps.Holds(framework.PoolOf(tp.Pool), framework.EndpointOf(leaving)) {
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
	if got := ps.IndexedBlocks(framework.PoolOf(tp.Pool)); got != 16 {
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
	if n := ps.IndexedBlocks(framework.PoolOf(a)); n != 0 {
		t.Fatalf("removed pool still indexes %d blocks", n)
	}
	if n := ps.IndexedBlocks(framework.PoolOf(b)); n != 16 {
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
	if got := ps.IndexedBlocks(framework.PoolOf(tp.Pool)); got != 0 {
		t.Fatalf("index holds %d blocks before any commit, want 0", got)
	}

	res, err := s.ScheduleDeferred(context.Background(), tp.Pool, &scheduling.Request{Model: "m", Prompt: p})
	if err != nil {
		t.Fatal(err)
	}
	res.Commit()
	if got := ps.IndexedBlocks(framework.PoolOf(tp.Pool)); got != 16 {
		t.Fatalf("index holds %d blocks after commit, want 16 (1 KB / 64 B)", got)
	}
	if !ps.Holds(framework.PoolOf(tp.Pool), framework.EndpointOf(res.Endpoints[0])) {
		t.Fatalf("the primary %s did not learn the prompt", res.Endpoints[0].Address)
	}
	res.Commit() // a second commit is a no-op
	if got := ps.IndexedBlocks(framework.PoolOf(tp.Pool)); got != 16 {
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
