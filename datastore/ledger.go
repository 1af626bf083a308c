// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"slices"
	"sync"
	"sync/atomic"
)

// The load ledger: an endpoint's load, and the only ways to change it.
//
// Each part of the load has one writer. A request's Lease (Pool.Acquire)
// counts it in flight on this replica; flow control's Hold (Pool.Hold)
// counts a request it keeps in the picker for an endpoint; peer sync sets
// the peer replicas' count (SetPeerInFlight); a scrape publishes what the
// server reported (SetMetrics), which also notes the in-flight count of the
// moment. The LoadObservers hear of each change of this replica's count.
// No production package but this one calls AddInFlight or AddHeld, and
// none but peer sync SetPeerInFlight: test/architecture's
// TestLoadLedgerHasNoOtherWriter fails otherwise. Tests set up loads with
// them.

// load is an endpoint's part of the ledger, shared by every snapshot the
// endpoint appears in, so that it survives endpoint-set swaps.
type load struct {
	// inFlight is this replica's requests in flight (its leases).
	inFlight atomic.Int64
	// inFlightAtMetrics is InFlight when the metrics were published.
	inFlightAtMetrics atomic.Int64
	// runningCapacity is RunningCapacity.
	runningCapacity atomic.Int64
	// peerInFlight is the requests the picker's peer replicas say they
	// have in flight on the endpoint (peer sync), as peer sync last set
	// it; zero without peers.
	peerInFlight atomic.Int64
	// held counts the requests flow control holds in the picker for the
	// endpoint (its holds); heldAny is their total, read without heldMu.
	heldAny atomic.Int64
	heldMu  sync.Mutex
	held    []heldCount
}

// heldCount is the requests of one priority held for an endpoint.
type heldCount struct {
	priority int
	n        int64
}

// LoadObserver hears of each change of this replica's requests in flight
// on an endpoint: a lease taken, moved or released. It is called on the
// request's goroutine and must not block.
type LoadObserver interface {
	InFlightChanged(pool *Pool, e *Endpoint)
}

// AddLoadObserver registers o for every pool's in-flight changes. Call
// before requests are served.
func (r *Registry) AddLoadObserver(o LoadObserver) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var next []LoadObserver
	if cur := r.loadObservers.Load(); cur != nil {
		next = slices.Clone(*cur)
	}
	next = append(next, o)
	r.loadObservers.Store(&next)
}

// Lease is one request's count on an endpoint of its pool, from Acquire to
// Release. It belongs to the request's goroutine: Move and Release are not
// safe for concurrent use, and Release gives the count back once however
// often it is called, so a request's count cannot leak or go negative.
type Lease struct {
	pool *Pool
	// e is the endpoint counted on, and the last one once released: what
	// the request's life reads after its end (the server that served it).
	e        *Endpoint
	released bool
}

// Acquire counts a request on e, an endpoint of p, until the lease it
// returns is released.
func (p *Pool) Acquire(e *Endpoint) *Lease {
	l := &Lease{pool: p, e: e}
	p.addInFlight(e, 1)
	return l
}

// Endpoint is the endpoint the lease counts on, or, once released, the
// one it counted on last; nil for a nil lease.
func (l *Lease) Endpoint() *Endpoint {
	if l == nil {
		return nil
	}
	return l.e
}

// Move moves the count to to (the endpoint that served the request when
// the gateway fell back to another); nothing once released.
func (l *Lease) Move(to *Endpoint) {
	if l == nil || l.released || to == nil || to == l.e {
		return
	}
	l.pool.addInFlight(to, 1)
	l.pool.addInFlight(l.e, -1)
	l.e = to
}

// Release gives the count back; later calls do nothing.
func (l *Lease) Release() {
	if l == nil || l.released {
		return
	}
	l.released = true
	l.pool.addInFlight(l.e, -1)
}

// addInFlight is a lease's change of e's count, told to the observers.
func (p *Pool) addInFlight(e *Endpoint, delta int64) {
	e.AddInFlight(delta)
	if p.registry == nil {
		return
	}
	if obs := p.registry.loadObservers.Load(); obs != nil {
		for _, o := range *obs {
			o.InFlightChanged(p, e)
		}
	}
}

// Hold is a request that flow control keeps in the picker for an endpoint,
// counted there as load of its priority (HeldAtOrAbove) until released.
// Release gives it back once however often it is called; a hold belongs
// to one goroutine at a time (flow control's queue, under its mutex).
type Hold struct {
	e        *Endpoint // nil once released
	priority int
}

// Hold counts a request of priority as held for e.
func (e *Endpoint) Hold(priority int) *Hold {
	e.AddHeld(priority, 1)
	return &Hold{e: e, priority: priority}
}

// Release ends the hold; later calls do nothing.
func (h *Hold) Release() {
	if h == nil || h.e == nil {
		return
	}
	h.e.AddHeld(h.priority, -1)
	h.e = nil
}

// SetMetrics publishes a new scrape, and notes the in-flight count of the
// moment (InFlightAtMetrics).
func (e *Endpoint) SetMetrics(m *Metrics) {
	e.state.load.inFlightAtMetrics.Store(e.InFlight())
	if m != nil && m.WaitingRequests > 0 && m.RunningRequests > 0 {
		e.state.load.runningCapacity.Store(int64(m.RunningRequests))
	}
	e.state.metrics.Store(m)
}

// RunningCapacity is how many requests the server ran in the last scrape
// that showed others waiting: how many it runs at once (a vLLM server's
// max_num_seqs, or fewer while its KV cache is the bound). Zero until a
// scrape has shown a request waiting.
func (e *Endpoint) RunningCapacity() int64 { return e.state.load.runningCapacity.Load() }

// InFlightAtMetrics is the in-flight count when the current metrics were
// published. The count now less it is negative once requests the scrape
// saw have finished: slots it showed busy, or requests it showed waiting
// that have started since, which the next scrape would show.
func (e *Endpoint) InFlightAtMetrics() int64 { return e.state.load.inFlightAtMetrics.Load() }

// InFlight is the number of requests poolpicker sent to the endpoint and has
// not yet seen finish: this replica's (OwnInFlight) and, with peer sync,
// those its peer replicas last reported (SetPeerInFlight).
func (e *Endpoint) InFlight() int64 {
	return e.state.load.inFlight.Load() + e.state.load.peerInFlight.Load()
}

// OwnInFlight is the number of requests this replica sent to the endpoint
// and has not yet seen finish: what it reports to its peers.
func (e *Endpoint) OwnInFlight() int64 { return e.state.load.inFlight.Load() }

// SetPeerInFlight sets the count of the peer replicas' requests in flight
// on the endpoint. Peer sync owns the count: it keeps what each peer said
// per pool and address and sets the sum here, so that the endpoint objects
// of one pod (a relabelled pod's copy shares this count) see one value
// whatever object peer sync found.
func (e *Endpoint) SetPeerInFlight(n int64) { e.state.load.peerInFlight.Store(n) }

// AddInFlight adjusts the in-flight count by delta (+1 on pick, -1 on finish).
func (e *Endpoint) AddInFlight(delta int64) { e.state.load.inFlight.Add(delta) }

// AddHeld adjusts by delta the requests of priority that flow control holds
// in the picker for the endpoint: requests scheduled to it that wait for one
// of its slots. They are load the scheduler weighs (HeldAtOrAbove), not
// requests the server has.
func (e *Endpoint) AddHeld(priority int, delta int64) {
	s := &e.state.load
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	s.heldAny.Add(delta)
	for i := range s.held {
		if s.held[i].priority == priority {
			s.held[i].n += delta
			return
		}
	}
	s.held = append(s.held, heldCount{priority: priority, n: delta})
}

// HeldAtOrAbove is the requests flow control holds for the endpoint whose
// priority is at least priority: those a request of that priority would
// wait behind there.
func (e *Endpoint) HeldAtOrAbove(priority int) int64 {
	// Small enough to inline: the scheduler asks it of every endpoint of
	// every pick, and flow control mostly holds none.
	if e.state.load.heldAny.Load() == 0 {
		return 0
	}
	return e.heldAtOrAbove(priority)
}

func (e *Endpoint) heldAtOrAbove(priority int) int64 {
	s := &e.state.load
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	var n int64
	for _, h := range s.held {
		if h.priority >= priority {
			n += h.n
		}
	}
	return max(n, 0)
}
