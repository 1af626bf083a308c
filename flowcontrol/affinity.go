// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import "github.com/poolpicker/poolpicker/datastore"

// The affinity policy: among the requests that may go, one whose prefix
// an endpoint was sent recently goes there before one it was not.

// Affinity order (Request.Affinity): a request is warm on an endpoint
// when its prefix was among the last affinityDepth released there. When the
// request that would go first is not warm on the endpoint it would take,
// the first warm one among the first affinityWindow of each flow that may
// go somewhere goes instead; the first is passed over at most
// affinityMaxSkips times.
const (
	affinityDepth    = 4
	affinityWindow   = 16
	affinityMaxSkips = 2
)

// affinity is, per endpoint, the Affinity keys of the requests released to
// it last, most recent first: the prefixes it likely holds.
type affinity struct {
	recent map[datastore.EndpointKey]*recentKeys
}

// note puts key first among e's.
func (a *affinity) note(e *datastore.Endpoint, key uint64) {
	r := a.recent[e.Key()]
	if r == nil {
		if a.recent == nil {
			a.recent = map[datastore.EndpointKey]*recentKeys{}
		}
		r = &recentKeys{}
		a.recent[e.Key()] = r
	}
	r.note(key)
}

// prune forgets the endpoints no longer in the pool (live) once they are
// as many as those in it.
func (a *affinity) prune(live map[datastore.EndpointKey]*datastore.Endpoint) {
	if len(a.recent) <= 2*len(live) {
		return
	}
	for k := range a.recent {
		if _, in := live[k]; !in {
			delete(a.recent, k)
		}
	}
}

// recentKeys are an endpoint's last affinityDepth distinct Affinity keys,
// most recent first; zero: none.
type recentKeys [affinityDepth]uint64

// rank is key's place in r, affinityDepth when absent or zero.
func (r *recentKeys) rank(key uint64) int {
	if key == 0 || r == nil {
		return affinityDepth
	}
	for i, k := range r {
		if k == key {
			return i
		}
	}
	return affinityDepth
}

// note puts key first in r.
func (r *recentKeys) note(key uint64) {
	i := r.rank(key)
	if i == affinityDepth {
		i = affinityDepth - 1
	}
	copy(r[1:i+1], r[:i])
	r[0] = key
}

// noteLocked records that a request of affinity key went to e.
func (pq *poolQueue) noteLocked(e *datastore.Endpoint, key uint64) {
	if e == nil || key == 0 {
		return
	}
	pq.affinity.note(e, key)
}

// rankLocked is w's Affinity rank on e: 0 when e was sent its prefix last.
func (pq *poolQueue) rankLocked(w *waiter, e *datastore.Endpoint) int {
	return pq.affinity.recent[e.Key()].rank(w.req.Affinity)
}

// warmOnLocked reports whether e was sent w's prefix among its last
// affinityDepth.
func (pq *poolQueue) warmOnLocked(w *waiter, e *datastore.Endpoint) bool {
	return pq.rankLocked(w, e) < affinityDepth
}

// warmLocked is the free endpoint that was sent w's prefix most recently,
// nil when none was among its last affinityDepth.
func (pq *poolQueue) warmLocked(w *waiter) *datastore.Endpoint {
	if w.req.Affinity == 0 {
		return nil
	}
	var best *datastore.Endpoint
	bestRank := affinityDepth
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] == nil {
			continue
		}
		if r := pq.rankLocked(w, e); r < bestRank {
			best, bestRank = e, r
		}
	}
	return best
}
