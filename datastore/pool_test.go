// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func src(name, ip string) EndpointSource {
	return EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: name}, UID: types.UID("uid-" + name), IP: ip, Labels: map[string]string{"app": "m"}}
}

func addresses(s *EndpointSet) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Address)
	}
	return out
}

func TestSetPodsEndpoints(t *testing.T) {
	cases := []struct {
		name  string
		ports []int32
		pods  []EndpointSource
		want  []string
	}{
		{name: "no pods", ports: []int32{8000}, want: nil},
		{name: "one pod one port", ports: []int32{8000}, pods: []EndpointSource{src("a", "10.0.0.1")}, want: []string{"10.0.0.1:8000"}},
		{name: "pods times ports, sorted by address", ports: []int32{8001, 8000},
			pods: []EndpointSource{src("b", "10.0.0.2"), src("a", "10.0.0.1")},
			want: []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"}},
		{name: "pod without IP skipped", ports: []int32{8000}, pods: []EndpointSource{src("a", ""), src("b", "10.0.0.2")}, want: []string{"10.0.0.2:8000"}},
		{name: "IPv6 bracketed", ports: []int32{8000}, pods: []EndpointSource{src("a", "fd00::1")}, want: []string{"[fd00::1]:8000"}},
		{name: "two pods with one IP give one endpoint", ports: []int32{8000}, pods: []EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.1")}, want: []string{"10.0.0.1:8000"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: tc.ports})
			p.SetPods(tc.pods)
			got := addresses(p.Endpoints())
			if !slices.Equal(got, tc.want) {
				t.Fatalf("endpoints = %v, want %v", got, tc.want)
			}
			for _, a := range tc.want {
				e, ok := p.Endpoints().Get(a)
				if !ok || e.Address != a {
					t.Fatalf("Get(%q) = %v, %v", a, e, ok)
				}
			}
			if _, ok := p.Endpoints().Get("10.9.9.9:1"); ok {
				t.Fatal("Get of an unknown address found something")
			}
		})
	}
}

func TestEndpointStateAcrossSwaps(t *testing.T) {
	r := NewRegistry()
	p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{8000}})
	p.SetPods([]EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.2")})
	a, _ := p.Endpoints().Get("10.0.0.1:8000")
	a.AddInFlight(3)
	a.SetMetrics(&Metrics{WaitingRequests: 7})

	// Pod b leaves; a stays and keeps its state.
	p.SetPods([]EndpointSource{src("a", "10.0.0.1")})
	a2, _ := p.Endpoints().Get("10.0.0.1:8000")
	if a2.InFlight() != 3 || a2.Metrics() == nil || a2.Metrics().WaitingRequests != 7 {
		t.Fatalf("state lost across swap: inflight %d metrics %+v", a2.InFlight(), a2.Metrics())
	}
	// A label change gives a new Endpoint value sharing the state.
	relabeled := src("a", "10.0.0.1")
	relabeled.Labels = map[string]string{"app": "m", "v": "2"}
	p.SetPods([]EndpointSource{relabeled})
	a3, _ := p.Endpoints().Get("10.0.0.1:8000")
	if a3.Labels["v"] != "2" || a3.InFlight() != 3 {
		t.Fatalf("relabeled endpoint: labels %v inflight %d", a3.Labels, a3.InFlight())
	}
	if a.Labels["v"] != "" {
		t.Fatal("old snapshot's endpoint was mutated")
	}
	// A recreated pod (new UID, same IP) starts fresh.
	recreated := src("a", "10.0.0.1")
	recreated.UID = "uid-a-2"
	p.SetPods([]EndpointSource{recreated})
	a4, _ := p.Endpoints().Get("10.0.0.1:8000")
	if a4.InFlight() != 0 || a4.Metrics() != nil || a4.PodUID != "uid-a-2" {
		t.Fatalf("recreated pod inherited state: inflight %d metrics %v uid %s", a4.InFlight(), a4.Metrics(), a4.PodUID)
	}
}

type event struct {
	kind           string
	pool           string
	added, removed []string
}

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) EndpointsChanged(p *Pool, added, removed []*Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := event{kind: "changed", pool: p.Key.Name}
	for _, e := range added {
		ev.added = append(ev.added, e.Address)
	}
	for _, e := range removed {
		ev.removed = append(ev.removed, e.Address)
	}
	r.events = append(r.events, ev)
}

func (r *recorder) PoolRemoved(p *Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{kind: "removed", pool: p.Key.Name, removed: addresses(p.Endpoints())})
}

func (r *recorder) take() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

func TestObservers(t *testing.T) {
	r := NewRegistry()
	rec := &recorder{}
	r.AddObserver(rec)
	key := PoolKey{Namespace: "ns", Name: "p"}
	p := r.Upsert(key, &PoolSpec{TargetPorts: []int32{8000}})
	if ev := rec.take(); len(ev) != 0 {
		t.Fatalf("a new empty pool notified: %+v", ev)
	}

	steps := []struct {
		name string
		do   func()
		want []event
	}{
		{"pods arrive", func() { p.SetPods([]EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.2")}) },
			[]event{{kind: "changed", pool: "p", added: []string{"10.0.0.1:8000", "10.0.0.2:8000"}}}},
		{"same pods again: no event", func() { p.SetPods([]EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.2")}) }, nil},
		{"one pod leaves", func() { p.SetPods([]EndpointSource{src("a", "10.0.0.1")}) },
			[]event{{kind: "changed", pool: "p", removed: []string{"10.0.0.2:8000"}}}},
		// The target-port change runs inside Upsert, which holds the
		// registry's writer lock: the notification must not need it.
		{"target ports change", func() { r.Upsert(key, &PoolSpec{TargetPorts: []int32{9000}}) },
			[]event{{kind: "changed", pool: "p", added: []string{"10.0.0.1:9000"}, removed: []string{"10.0.0.1:8000"}}}},
		{"pool removed", func() { r.Remove(key) },
			[]event{{kind: "removed", pool: "p", removed: []string{"10.0.0.1:9000"}}}},
		{"writes to a removed pool are not heard", func() { p.SetPods(nil) }, nil},
	}
	for _, st := range steps {
		done := make(chan struct{})
		go func() { st.do(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: deadlocked", st.name)
		}
		got := rec.take()
		if fmt.Sprint(got) != fmt.Sprint(st.want) {
			t.Fatalf("%s: events %+v, want %+v", st.name, got, st.want)
		}
	}
	if !p.Removed() || p.Synced() {
		t.Fatalf("removed pool: Removed %v Synced %v", p.Removed(), p.Synced())
	}
}

// TestConcurrentReadersDuringSwaps reads a pool's endpoints in tight loops
// while a writer swaps between two disjoint sets: every read must be one
// whole set, never a mix or an empty set.
func TestConcurrentReadersDuringSwaps(t *testing.T) {
	r := NewRegistry()
	key := PoolKey{Namespace: "ns", Name: "p"}
	p := r.Upsert(key, &PoolSpec{TargetPorts: []int32{8000, 8001}})
	var setA, setB []EndpointSource
	for i := range 50 {
		setA = append(setA, src(fmt.Sprintf("a%d", i), fmt.Sprintf("10.1.0.%d", i+1)))
		setB = append(setB, src(fmt.Sprintf("b%d", i), fmt.Sprintf("10.2.0.%d", i+1)))
	}
	p.SetPods(setA)
	wantA, wantB := addresses(p.Endpoints()), []string(nil)
	p.SetPods(setB)
	wantB = addresses(p.Endpoints())

	var stop atomic.Bool
	var reads, bad atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				pool, ok := r.Get(key)
				if !ok {
					bad.Add(1)
					continue
				}
				got := addresses(pool.Endpoints())
				if !slices.Equal(got, wantA) && !slices.Equal(got, wantB) {
					bad.Add(1)
				}
				reads.Add(1)
			}
		})
	}
	for i := range 400 {
		if i%2 == 0 {
			p.SetPods(setA)
		} else {
			p.SetPods(setB)
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d reads saw neither whole set", bad.Load(), reads.Load())
	}
	if reads.Load() == 0 {
		t.Fatal("no reads happened")
	}
}

func TestAddressIndex(t *testing.T) {
	r := NewRegistry()
	k1, k2 := PoolKey{Namespace: "ns", Name: "one"}, PoolKey{Namespace: "ns", Name: "two"}
	p1 := r.Upsert(k1, &PoolSpec{TargetPorts: []int32{8000}})
	p2 := r.Upsert(k2, &PoolSpec{TargetPorts: []int32{8000}})
	shared, own := src("s", "10.0.0.1"), src("o", "10.0.0.2")
	p1.SetPods([]EndpointSource{shared, own})
	p2.SetPods([]EndpointSource{shared})

	keys := func(ps []*Pool) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Key.Name)
		}
		slices.Sort(out)
		return out
	}
	check := func(step, addr string, want ...string) {
		t.Helper()
		if got := keys(r.ByEndpoint(addr)); !slices.Equal(got, want) {
			t.Fatalf("%s: ByEndpoint(%s) = %v, want %v", step, addr, got, want)
		}
	}
	check("both pools", "10.0.0.1:8000", "one", "two")
	check("own pod", "10.0.0.2:8000", "one")
	check("unknown", "10.0.0.9:8000")

	p1.SetPods([]EndpointSource{own})
	check("shared left one", "10.0.0.1:8000", "two")

	// A pod recreated under the same IP stays indexed.
	again := shared
	again.UID = "uid-s-2"
	p2.SetPods([]EndpointSource{again})
	check("recreated", "10.0.0.1:8000", "two")

	r.Upsert(k1, &PoolSpec{TargetPorts: []int32{9000}})
	check("old port gone", "10.0.0.2:8000")
	check("new port", "10.0.0.2:9000", "one")

	r.Remove(k2)
	check("pool removed", "10.0.0.1:8000")
	r.Remove(k1)
	check("all removed", "10.0.0.2:9000")
	r.Remove(k1) // unknown key: no-op
}

func TestByPicker(t *testing.T) {
	r := NewRegistry()
	a := PoolKey{Namespace: "ns", Name: "a"}
	r.Upsert(a, &PoolSpec{TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9002})
	r.Upsert(PoolKey{Namespace: "ns", Name: "b"}, &PoolSpec{TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9003})
	r.Upsert(PoolKey{Namespace: "other", Name: "c"}, &PoolSpec{TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9002})
	r.Upsert(PoolKey{Namespace: "ns", Name: "d"}, &PoolSpec{TargetPorts: []int32{8000}})

	names := func(ps []*Pool) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Key.String())
		}
		return fmt.Sprint(out)
	}
	cases := []struct {
		ns, svc string
		port    int32
		want    string
	}{
		{"ns", "epp", 9002, "[ns/a]"},
		{"ns", "epp", 9003, "[ns/b]"},
		{"ns", "epp", 0, "[ns/a ns/b]"},
		{"other", "epp", 0, "[other/c]"},
		{"ns", "nope", 0, "[]"},
		{"ns", "", 0, "[]"},
	}
	for _, tc := range cases {
		if got := names(r.ByPicker(tc.ns, tc.svc, tc.port)); got != tc.want {
			t.Errorf("ByPicker(%s, %s, %d) = %s, want %s", tc.ns, tc.svc, tc.port, got, tc.want)
		}
	}
	if got := names(r.Pools()); got != "[ns/a ns/b ns/d other/c]" {
		t.Errorf("Pools() = %s", got)
	}
	// Moving a pool to another picker port re-indexes it.
	r.Upsert(a, &PoolSpec{TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9003})
	if got := names(r.ByPicker("ns", "epp", 9003)); got != "[ns/a ns/b]" {
		t.Errorf("after move: %s", got)
	}
	if got := names(r.ByPicker("ns", "epp", 9002)); got != "[]" {
		t.Errorf("after move, old port: %s", got)
	}
}

func TestAllSynced(t *testing.T) {
	r := NewRegistry()
	if !r.AllSynced() {
		t.Fatal("an empty registry is synced")
	}
	p := r.Upsert(PoolKey{Namespace: "ns", Name: "a"}, &PoolSpec{TargetPorts: []int32{1}})
	if r.AllSynced() || p.Synced() {
		t.Fatal("a new pool is not synced")
	}
	p.SetSynced(true)
	if !r.AllSynced() || r.Len() != 1 {
		t.Fatalf("AllSynced %v Len %d", r.AllSynced(), r.Len())
	}
}

func TestPolicy(t *testing.T) {
	r := NewRegistry()
	p := r.Upsert(PoolKey{Namespace: "ns", Name: "a"}, &PoolSpec{TargetPorts: []int32{1}})
	if p.Policy() == nil {
		t.Fatal("a new pool's policy is nil")
	}
	p.SetPolicy(&Policy{Objectives: map[string]int{"batch": -1}})
	if pr, ok := p.Policy().Priority("batch"); pr != -1 || !ok {
		t.Fatalf("Priority(batch) = %d, %v", pr, ok)
	}
	if pr, ok := p.Policy().Priority("unknown"); pr != 0 || ok {
		t.Fatalf("Priority(unknown) = %d, %v", pr, ok)
	}
	p.SetPolicy(nil)
	if p.Policy() == nil {
		t.Fatal("SetPolicy(nil) left a nil policy")
	}
}

func TestMetricsFresh(t *testing.T) {
	at := time.Unix(1000, 0)
	const staleness = 2 * time.Second
	cases := []struct {
		name string
		m    *Metrics
		age  time.Duration
		want bool
	}{
		{"never scraped", nil, 0, false},
		{"busy, within the threshold", &Metrics{ScrapedAt: at}, staleness, true},
		{"busy, past the threshold", &Metrics{ScrapedAt: at}, staleness + 1, false},
		{"interval shorter than the threshold", &Metrics{ScrapedAt: at, Interval: 500 * time.Millisecond}, staleness + 1, false},
		{"idle, within two intervals", &Metrics{ScrapedAt: at, Interval: 30 * time.Second}, 60 * time.Second, true},
		{"idle, past two intervals", &Metrics{ScrapedAt: at, Interval: 30 * time.Second}, 60*time.Second + 1, false},
	}
	for _, tc := range cases {
		if got := tc.m.Fresh(at.Add(tc.age), staleness); got != tc.want {
			t.Errorf("%s: Fresh after %v = %v, want %v", tc.name, tc.age, got, tc.want)
		}
	}
}

// NoteRequest tells demand observers how long the pool was idle, at most
// every 100 ms, and never after the pool left.
func TestNoteRequest(t *testing.T) {
	r := NewRegistry()
	d := &demandRecorder{}
	r.AddObserver(d)
	p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{1}})
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration
		want []time.Duration // idle times heard
	}{
		{0, []time.Duration{math.MaxInt64}},
		{50 * time.Millisecond, nil},
		{100 * time.Millisecond, []time.Duration{100 * time.Millisecond}},
		{10 * time.Second, []time.Duration{10*time.Second - 100*time.Millisecond}},
	}
	for _, st := range steps {
		p.NoteRequest(t0.Add(st.at))
		if got := d.take(); !slices.Equal(got, st.want) {
			t.Fatalf("request at +%v: heard %v, want %v", st.at, got, st.want)
		}
	}
	if got := p.LastRequest(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("LastRequest = %v", got)
	}
	r.Remove(p.Key)
	p.NoteRequest(t0.Add(time.Minute))
	if got := d.take(); len(got) != 0 {
		t.Errorf("a removed pool's request heard: %v", got)
	}
}

type demandRecorder struct {
	recorder
	idle []time.Duration
}

func (d *demandRecorder) PoolDemanded(_ *Pool, idle time.Duration) { d.idle = append(d.idle, idle) }

func (d *demandRecorder) take() []time.Duration {
	out := d.idle
	d.idle = nil
	return out
}
