// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import "github.com/poolpicker/poolpicker/datastore"

// Free slots and stealing: which endpoints may take a request now, its
// preferred one with a free slot, an idle one (stealing, below
// Options.StealBelow), and, below the pool's top priority, only those that
// would start it at once.

// freeLocked maps the pool's endpoints in pq.free, those with a free slot
// to themselves, the others to nil, and, when a request of priority lowest
// is below the pool's top (with Options.EndpointStartsAtOnce), in
// pq.startFree those that would start a request at once; false when none
// has a free slot.
func (pq *poolQueue) freeLocked(lowest int) bool {
	if pq.slotFree == nil {
		pq.slotFree = map[datastore.EndpointKey]*datastore.Endpoint{}
	}
	clear(pq.slotFree)
	pq.free = pq.slotFree
	var startsAtOnce func(*datastore.Endpoint) bool
	if pq.belowTopLocked(lowest) {
		startsAtOnce = pq.c.opts.EndpointStartsAtOnce
	}
	if startsAtOnce != nil {
		if pq.startFree == nil {
			pq.startFree = map[datastore.EndpointKey]*datastore.Endpoint{}
		}
		clear(pq.startFree)
	}
	any := false
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.c.opts.EndpointSaturated(e) {
			pq.free[e.Key()] = nil
		} else {
			pq.free[e.Key()], any = e, true
		}
		if startsAtOnce != nil {
			if pq.free[e.Key()] != nil && startsAtOnce(e) {
				pq.startFree[e.Key()] = e
			} else {
				pq.startFree[e.Key()] = nil
			}
		}
	}
	pq.affinity.prune(pq.free)
	return any
}

// homeLocked is the free endpoint that takes a request preferring prefs:
// its first preference while that one has a free slot; any free endpoint
// for a request without a preference, or whose first preference left the
// pool. Nil: it waits for its preference.
func (pq *poolQueue) homeLocked(w *waiter) *datastore.Endpoint { return pq.homeOf(w.req.Endpoints) }

func (pq *poolQueue) homeOf(prefs []*datastore.Endpoint) *datastore.Endpoint {
	if len(prefs) > 0 {
		if e := pq.free[prefs[0].Key()]; e != nil {
			return e
		}
		if _, in := pq.free[prefs[0].Key()]; in {
			return nil
		}
	}
	return pq.anyFreeLocked(nil)
}

// idleLocked is a free endpoint that may take a request preferring another,
// busy endpoint: one with fewer than StealBelow requests in flight, the
// earliest of prefs if several are; nil when none is.
func (pq *poolQueue) idleLocked(w *waiter) *datastore.Endpoint { return pq.idleOf(w.req.Endpoints) }

func (pq *poolQueue) idleOf(prefs []*datastore.Endpoint) *datastore.Endpoint {
	below := int64(pq.c.opts.StealBelow)
	for _, p := range prefs {
		if e := pq.free[p.Key()]; e != nil && e.InFlight() < below {
			return e
		}
	}
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] != nil && e.InFlight() < below {
			return e
		}
	}
	return nil
}

// targetLocked is the endpoint a request that finds nobody waiting goes to
// at once: its preferred one with a free slot, else an idle one; nil: it
// waits.
func (pq *poolQueue) targetLocked(req *Request) *datastore.Endpoint {
	if !pq.freeLocked(req.Priority) {
		return nil
	}
	defer pq.freeForLocked(req.Priority)()
	if e := pq.homeOf(req.Endpoints); e != nil {
		return e
	}
	return pq.idleOf(req.Endpoints)
}

// belowTopLocked reports whether a request of priority p may take only
// the endpoints that would start it at once.
func (pq *poolQueue) belowTopLocked(p int) bool {
	return pq.c.opts.EndpointStartsAtOnce != nil && pq.hasTop && p < pq.top
}

// freeForLocked makes pq.free the endpoints a request of priority p may
// take (startFree, filled by freeLocked, below the pool's top priority);
// the function it returns restores it.
func (pq *poolQueue) freeForLocked(p int) func() {
	if !pq.belowTopLocked(p) {
		return func() {}
	}
	pq.free = pq.startFree
	return func() { pq.free = pq.slotFree }
}

// anyFreeLocked is a free endpoint, the earliest of prefs if several are.
func (pq *poolQueue) anyFreeLocked(prefs []*datastore.Endpoint) *datastore.Endpoint {
	for _, p := range prefs {
		if e := pq.free[p.Key()]; e != nil {
			return e
		}
	}
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] != nil {
			return e
		}
	}
	return nil
}
