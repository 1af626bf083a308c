// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package frameworktest builds what a scheduling plugin sees (pools,
// endpoints, scrapes, cycle states) without a scheduler or a cluster, and
// runs a plugin's extension points as the scheduler does, failing the test
// when the plugin breaks the framework's contract. It is for the tests of
// plugins, in poolpicker and out of it.
package frameworktest

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Saturation is the scheduler's default saturation thresholds, which
// NewCycle gives a cycle (framework.CycleState.Saturated).
var Saturation = framework.Saturation{QueueDepth: 5, KVCacheUtil: 0.8}

// Endpoint is an endpoint of a test pool: one port of one pod, whose
// scrape and in-flight count a test sets. It implements framework.Endpoint.
type Endpoint struct {
	address, ip string
	port        int32
	pod         types.NamespacedName
	uid         types.UID
	labels      map[string]string
	scrape      atomic.Pointer[framework.Scrape]
	inFlight    atomic.Int64
}

var _ framework.Endpoint = (*Endpoint)(nil)

// NewEndpoint returns the endpoint at address ("ip:port") of pod ns/pod-<ip>
// with labels (shared, not copied), never scraped. A malformed address
// panics: it is a bug of the test.
func NewEndpoint(address string, labels map[string]string) *Endpoint {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		panic(fmt.Sprintf("frameworktest: endpoint address %q: %v", address, err))
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		panic(fmt.Sprintf("frameworktest: endpoint address %q: port: %v", address, err))
	}
	return &Endpoint{address: address, ip: host, port: int32(p), labels: labels,
		pod: types.NamespacedName{Namespace: "ns", Name: "pod-" + host}, uid: types.UID("uid-" + host)}
}

// SetScrape publishes s as the endpoint's latest scrape (nil: never
// scraped), as the scraper would.
func (e *Endpoint) SetScrape(s *framework.Scrape) { e.scrape.Store(s) }

// SetInFlight sets the requests in flight to the endpoint.
func (e *Endpoint) SetInFlight(n int64) { e.inFlight.Store(n) }

// Address implements framework.Endpoint.
func (e *Endpoint) Address() string { return e.address }

// IP implements framework.Endpoint.
func (e *Endpoint) IP() string { return e.ip }

// Port implements framework.Endpoint.
func (e *Endpoint) Port() int32 { return e.port }

// Pod implements framework.Endpoint.
func (e *Endpoint) Pod() types.NamespacedName { return e.pod }

// PodUID implements framework.Endpoint.
func (e *Endpoint) PodUID() types.UID { return e.uid }

// Labels implements framework.Endpoint.
func (e *Endpoint) Labels() map[string]string { return e.labels }

// Key implements framework.Endpoint.
func (e *Endpoint) Key() framework.EndpointKey {
	return framework.EndpointKey{UID: e.uid, Port: e.port}
}

// Metrics implements framework.Endpoint.
func (e *Endpoint) Metrics() framework.Metrics { return framework.MetricsOf(e.scrape.Load()) }

// InFlight implements framework.Endpoint.
func (e *Endpoint) InFlight() int64 { return e.inFlight.Load() }

// Load is a scrape of now with waiting requests queued and the KV cache
// kv (0..1) used.
func Load(waiting int, kv float64) *framework.Scrape {
	return &framework.Scrape{WaitingRequests: waiting, KVCacheUsage: kv, ScrapedAt: time.Now()}
}

// endpointSet is an immutable snapshot of a Pool's endpoints.
type endpointSet struct {
	eps       []*Endpoint
	byAddress map[string]*Endpoint
}

func newEndpointSet(eps []*Endpoint) *endpointSet {
	s := &endpointSet{eps: slices.Clone(eps), byAddress: make(map[string]*Endpoint, len(eps))}
	slices.SortFunc(s.eps, func(a, b *Endpoint) int { return cmp.Compare(a.address, b.address) })
	for _, e := range s.eps {
		s.byAddress[e.address] = e
	}
	return s
}

func (s *endpointSet) Len() int                    { return len(s.eps) }
func (s *endpointSet) At(i int) framework.Endpoint { return s.eps[i] }

func (s *endpointSet) Get(address string) (framework.Endpoint, bool) {
	if e, ok := s.byAddress[address]; ok {
		return e, true
	}
	return nil, false
}

// Pool is a synced pool of test endpoints, whose endpoint set a test swaps
// as pods come and go. It implements framework.Pool and tells the
// observers it was given, as the scheduler tells its plugins.
type Pool struct {
	key         framework.PoolKey
	annotations map[string]string
	endpoints   atomic.Pointer[endpointSet]
	removed     atomic.Bool
	requests    atomic.Uint64

	mu        sync.Mutex // serialises SetEndpoints and Remove
	observers []framework.PoolObserver
}

var _ framework.Pool = (*Pool)(nil)

// NewPool returns the synced pool namespace/name of endpoints eps.
func NewPool(namespace, name string, eps ...*Endpoint) *Pool {
	p := &Pool{key: framework.PoolKey{Namespace: namespace, Name: name}}
	p.endpoints.Store(newEndpointSet(eps))
	return p
}

// Observe has o hear of the pool's endpoint changes and removal.
func (p *Pool) Observe(o framework.PoolObserver) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observers = append(p.observers, o)
}

// SetEndpoints swaps the pool's endpoint set for eps and tells the
// observers which endpoints came and went.
func (p *Pool) SetEndpoints(eps ...*Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, next := p.endpoints.Load(), newEndpointSet(eps)
	p.endpoints.Store(next)
	var added, removed []framework.Endpoint
	for _, e := range next.eps {
		if old.byAddress[e.address] != e {
			added = append(added, e)
		}
	}
	for _, e := range old.eps {
		if next.byAddress[e.address] != e {
			removed = append(removed, e)
		}
	}
	for _, o := range p.observers {
		o.EndpointsChanged(p, added, removed)
	}
}

// Remove marks the pool removed and tells the observers.
func (p *Pool) Remove() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed.Store(true)
	for _, o := range p.observers {
		o.PoolRemoved(p)
	}
}

// SetAnnotations sets the pool's annotations (shared, not copied).
func (p *Pool) SetAnnotations(a map[string]string) { p.annotations = a }

// Key implements framework.Pool.
func (p *Pool) Key() framework.PoolKey { return p.key }

// Annotations implements framework.Pool.
func (p *Pool) Annotations() map[string]string { return p.annotations }

// Endpoints implements framework.Pool.
func (p *Pool) Endpoints() framework.EndpointSet { return p.endpoints.Load() }

// Synced implements framework.Pool: a test pool is always synced.
func (p *Pool) Synced() bool { return true }

// Removed implements framework.Pool.
func (p *Pool) Removed() bool { return p.removed.Load() }

// Requests implements framework.Pool: the cycles NewCycle began.
func (p *Pool) Requests() uint64 { return p.requests.Load() }

// LastRequest implements framework.Pool: zero, a test pool keeps no clock.
func (p *Pool) LastRequest() time.Time { return time.Time{} }

// NewCycle is a cycle state over pool's current endpoints for a request
// whose model is targetModel, as the scheduler prepares one: the default
// Saturation, and a random source seeded with seed (the same seed, the
// same tie-breaks).
func NewCycle(pool framework.Pool, targetModel string, seed uint64) *framework.CycleState {
	if p, ok := pool.(*Pool); ok {
		p.requests.Add(1)
	}
	cs := framework.NewCycleState(pool, Saturation, SeededRand(seed))
	cs.TargetModel = targetModel
	return cs
}

// SeededRand is a deterministic random source safe for concurrent use.
func SeededRand(seed uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

// Candidates are the endpoints of cs's snapshot as the scheduler hands
// them to the first filter: in order, each with its position as Index and
// its scrape as Metrics (the scheduler would leave a stale one out).
func Candidates(cs *framework.CycleState) []framework.Candidate {
	out := make([]framework.Candidate, 0, cs.Endpoints.Len())
	for i, e := range framework.All(cs.Endpoints) {
		out = append(out, framework.Candidate{Endpoint: e, Metrics: e.Metrics(), Index: i})
	}
	return out
}

// Build is the plugin factory f makes of the instance name from params as
// a config gives them in JSON (empty: none), with a handle that logs to t;
// an error fails t.
func Build(t testing.TB, f framework.Factory, name, params string) framework.Plugin {
	t.Helper()
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := f(name, raw, Handle(t))
	if err != nil {
		t.Fatalf("plugin %s: %v", name, err)
	}
	return p
}

// Handle is a plugin handle for t: done when t ends, logging to t, with a
// metrics registry of its own.
func Handle(t testing.TB) framework.Handle {
	return framework.NewHandle(t.Context(), testr.NewWithInterface(t, testr.Options{}), nil)
}

// Filter runs f on a copy of candidates and returns what it kept and its
// status. It fails t when f breaks the Filter contract: a candidate kept
// that it was not given, or candidates kept out of their order.
func Filter(t testing.TB, f framework.Filter, cs *framework.CycleState, req *framework.Request, candidates []framework.Candidate) ([]framework.Candidate, *framework.Status) {
	t.Helper()
	in := slices.Clone(candidates)
	kept, st := f.Filter(t.Context(), cs, req, in)
	pos := 0
	for _, k := range kept {
		for pos < len(candidates) && candidates[pos] != k {
			pos++
		}
		if pos == len(candidates) {
			t.Fatalf("filter %s kept %s (index %d), not one of the candidates in order", f.TypedName(), k.Endpoint.Address(), k.Index)
		}
		pos++
	}
	return kept, st
}

// Score runs s over candidates with zeroed scores, as the scheduler does,
// and returns the scores as the scheduler counts them (NaN and values
// outside [0,1] clamped; all 0 when the status is not a success) with the
// status. It fails t when s changes the candidates.
func Score(t testing.TB, s framework.Scorer, cs *framework.CycleState, req *framework.Request, candidates []framework.Candidate) ([]float64, *framework.Status) {
	t.Helper()
	before := slices.Clone(candidates)
	scores := make([]float64, len(candidates))
	st := s.Score(t.Context(), cs, req, candidates, scores)
	if !slices.Equal(before, candidates) {
		t.Fatalf("scorer %s changed the candidates", s.TypedName())
	}
	if !st.IsSuccess() {
		clear(scores)
	}
	for i, v := range scores {
		switch {
		case v > 1:
			scores[i] = 1
		case !(v >= 0):
			scores[i] = 0
		}
	}
	return scores, st
}

// Pick runs p for up to n endpoints and returns the candidates' indexes
// it picked. It fails t when p picks more than n, one twice, or one out of
// range.
func Pick(t testing.TB, p framework.Picker, cs *framework.CycleState, req *framework.Request, candidates []framework.Candidate, scores []float64, n int) []int {
	t.Helper()
	picked := p.Pick(t.Context(), cs, req, candidates, scores, n, nil)
	if len(picked) > n {
		t.Fatalf("picker %s picked %d, want at most %d", p.TypedName(), len(picked), n)
	}
	seen := map[int]bool{}
	for _, i := range picked {
		if i < 0 || i >= len(candidates) || seen[i] {
			t.Fatalf("picker %s picked %v of %d candidates: one out of range or twice", p.TypedName(), picked, len(candidates))
		}
		seen[i] = true
	}
	return picked
}
