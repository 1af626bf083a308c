// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package flowcontrol holds requests in the picker while their pool is
// saturated or has no ready endpoint, and releases them by priority band and
// fairly between the flows of a band.
//
// Every pool has its own queue: one pool's backlog never holds another's
// requests. Within a pool, requests wait in bands, one per objective
// priority, and a band is served only while no request of a band above it
// may go anywhere. Within a band, the flows (an objective, or the value of
// a header the operator names) are served in turn, one request each, so a
// flow's share of service does not follow its arrival rate while several
// are backlogged.
//
// A request without Request.Endpoints waits for the pool: it is released
// once any endpoint has a free slot by the saturation detector, and the
// caller schedules it then. With Options.PerEndpoint the caller schedules
// first and a request waits for an endpoint: the one the scheduler picked
// for it (Request.Endpoints, the holder of its prompt's prefix), released
// once that endpoint has a free slot, so that the model servers' own
// first-come queues stay short and a request of a high band does not wait
// in them behind one of a low band. While it waits it counts as held load
// on that endpoint (a datastore.Hold), which the scheduler's
// load scorers weigh for requests of its priority and below. An idle
// endpoint (fewer than Options.StealBelow requests in flight) takes a
// request waiting for a busy one, and so does any endpoint with a
// free slot once the request has waited Options.StealAfter: a request
// sent away from its prefix costs its prefill, a slot left idle costs
// the pool its service.
//
// Requests that name their prompt's prefix (Request.Affinity) are served
// by it: of the requests of a band that may take an endpoint's free slot,
// one whose prefix was among the last few sent there goes first, before
// older ones whose prefix the endpoint may have evicted meanwhile, and a
// request waiting for a busy endpoint takes a free one that was sent its
// prefix lately. An older request is passed over twice at most.
// Where the servers' caches cannot hold every prefix they are offered,
// this serves a prefix's requests together and keeps the hit rate that
// waiting would otherwise cost.
//
// Nothing polls. A queue is looked at when something may have freed a slot:
// a request of the pool finished (Ticket.Done), a scrape of one of its
// servers was published (Controller.Wake), its endpoints changed, the
// request the queue released last was picked (Ticket.Picked), or a request
// reached StealAfter. The queue releases one request at a time and waits
// for its pick, so that the next look at saturation sees that request's
// in-flight count.
//
// A pool without ready endpoints has a waiting room with its own TTL: its
// requests wait there until the pool's endpoint set is no longer empty, then
// go on as any other request.
//
// Each policy has a file of its own: queue.go admits, dispatches and
// removes; bands.go orders by band and flow; slots.go says which endpoints
// may take a request (preferred, idle, stolen, started at once);
// affinity.go keeps the prefixes sent to each endpoint; waitingroom.go
// holds the requests of a pool without endpoints. They share the pool
// queue's one mutex, so a release decision sees every policy's state at once.
//
// Lock order: a pool queue's mutex is the only lock of the package, and an
// endpoint's held count (datastore.Hold, a lock that takes nothing
// else) is adjusted under it; the process-wide byte count is an
// atomic. The saturation detector and Options.Waiting are
// called with the queue's mutex held and must not call back into the
// Controller.
package flowcontrol
