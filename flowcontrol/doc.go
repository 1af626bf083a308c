// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package flowcontrol holds requests in the picker while their pool is
// saturated or has no ready endpoint, and releases them by priority band and
// fairly between the flows of a band.
//
// Every pool has its own queue: one pool's backlog never holds another's
// requests. Within a pool, requests wait in bands, one per objective
// priority, and a band is served only while every band above it is empty.
// Within a band, the flows (an objective, or the value of a header the
// operator names) are served in turn, one request each, so a flow's share of
// service does not follow its arrival rate while several are backlogged.
//
// Nothing polls. A queue is looked at when something may have freed a slot:
// a request of the pool finished (Ticket.Done), a scrape of one of its
// servers was published (Controller.Wake), its endpoints changed, or the
// request the queue released last was picked (Ticket.Picked). The queue
// releases one request at a time and waits for its pick, so that the next
// look at saturation sees that request's in-flight count.
//
// A pool without ready endpoints has a waiting room with its own TTL: its
// requests wait there until the pool's endpoint set is no longer empty, then
// go on as any other request.
//
// Lock order: a pool queue's mutex is the only lock; the process-wide byte
// count is an atomic. The saturation detector and Options.Waiting are
// called with the queue's mutex held and must not call back into the
// Controller.
package flowcontrol
