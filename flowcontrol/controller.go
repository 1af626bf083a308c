// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
)

// Reasons of the refusals (Error.Reason), also the reason label of
// inference_extension_flow_control_rejected_total.
const (
	ReasonQueueTTLExpired    = "QueueTTLExpired"
	ReasonQueueFull          = "QueueFull"
	ReasonQueueBytesExceeded = "QueueBytesExceeded"
	ReasonNoEndpointsTimeout = "NoEndpointsTimeout"
	ReasonPoolRemoved        = "PoolRemoved"
)

// Error is a request flow control refuses: Code is the HTTP status to
// answer (429 for a full queue or an expired wait, 503 when no endpoint
// came), Reason one of the Reason constants.
type Error struct {
	Code    int
	Reason  string
	Message string
}

func (e *Error) Error() string { return e.Reason + ": " + e.Message }

// Request is what flow control knows of a request.
type Request struct {
	// ID is the request's x-request-id, for logs.
	ID string
	// Flow is the request's fairness key within its band: the value of
	// Options.FlowHeader, else the objective. At most MaxFlowKeyBytes.
	Flow string
	// Priority is the objective's priority: the band.
	Priority int
	// Bytes is the request body the stream holds while it waits.
	Bytes int64
	// Endpoints are the scheduler's pick for the request, preferred first
	// (the endpoint holding its prompt's prefix, then the fallbacks): it
	// waits for the first while that one is busy, unless an idle endpoint
	// takes it. Empty: any endpoint with a free slot takes it.
	Endpoints []*datastore.Endpoint
	// Affinity names the request's prompt prefix (a hash of its model and
	// the prompt's first bytes); zero: none. An endpoint's free slot goes
	// to a waiting request whose Affinity was among the last ones released
	// there, before older ones whose prefix it may no longer hold, so that
	// the requests of a prefix are served together.
	Affinity uint64
	// Queued, when set, is called once if the request goes into the queue
	// (it did not find its endpoint free), on the caller's goroutine before
	// Admit waits: the caller has the scheduler learn the pick then, so
	// that the requests scheduled while this one waits see its prefix on
	// the endpoint it waits for.
	Queued func()
}

// Controller queues the requests of every served pool; it is a
// datastore.Observer (register it with Registry.AddObserver) so that an
// endpoint set turning non-empty releases a pool's waiting room and a
// removed pool's waiters are answered at once.
type Controller struct {
	opts       Options
	m          *metrics
	flowHeader string
	// bytes is the body bytes queued over every pool (MaxQueuedBytes),
	// shared fairly between namespaces and pools.
	bytes *fairshare.Limit
	// pools holds a *poolQueue per *datastore.Pool that had a request, so a
	// pool removed and added again starts afresh.
	pools sync.Map
}

var _ datastore.Observer = (*Controller)(nil)

// New returns a controller; opts.EndpointSaturated is required.
func New(opts Options) (*Controller, error) {
	if opts.EndpointSaturated == nil {
		return nil, errors.New("flowcontrol: a saturation detector (Options.EndpointSaturated) is required")
	}
	opts.setDefaults()
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("flowcontrol: registering metrics: %w", err)
	}
	bytes := fairshare.New(fairshare.Options{Name: "queued_request_bytes", Flag: "flow-control-max-queued-bytes", Unit: "bytes",
		Capacity: opts.MaxQueuedBytes, ReservePercent: opts.FairShareReservePercent})
	if err := opts.Registerer.Register(bytes); err != nil {
		return nil, fmt.Errorf("flowcontrol: registering metrics: %w", err)
	}
	return &Controller{opts: opts, m: m, bytes: bytes, flowHeader: strings.ToLower(opts.FlowHeader)}, nil
}

// FlowHeader is the lower-cased name of the header that names a request's
// flow; empty when flows are objectives.
func (c *Controller) FlowHeader() string { return c.flowHeader }

// PerEndpoint reports Options.PerEndpoint: requests are scheduled before
// Admit, which takes their pick in Request.Endpoints.
func (c *Controller) PerEndpoint() bool { return c.opts.PerEndpoint }

// QueuedBytes is the body bytes queued over every pool now.
func (c *Controller) QueuedBytes() int64 { return c.bytes.Total() }

// Admit returns once req may be sent to an endpoint of pool
// (Ticket.Endpoint): at once while nobody waits and its preferred endpoint
// (req.Endpoints[0]) has a free slot or another is idle, else when the
// queue releases it. It returns an *Error when the request is refused
// (queue full, TTL, no endpoint within NoEndpointTTL), and ctx's error as
// soon as ctx is done (the client went away): the request has left the
// queue then. The caller counts the request in flight on
// Ticket.Endpoint, then calls Ticket.Picked (also when its pick failed),
// and Ticket.Done once the request has finished.
func (c *Controller) Admit(ctx context.Context, pool *datastore.Pool, req Request) (*Ticket, error) {
	if len(req.Flow) > MaxFlowKeyBytes {
		return nil, &Error{Code: http.StatusBadRequest, Reason: "BadRequest",
			Message: fmt.Sprintf("flow header %s is longer than %d bytes", c.flowHeader, MaxFlowKeyBytes)}
	}
	pq := c.queue(pool)
	if pq == nil {
		return nil, errRemoved(pool)
	}
	if pool.Endpoints().Len() == 0 {
		if c.opts.NoEndpointTTL == 0 {
			// No waiting room: the scheduler answers 503 at once.
			return &Ticket{pq: pq}, nil
		}
		if err := pq.awaitEndpoints(ctx, req); err != nil {
			return nil, err
		}
	}
	return pq.admit(ctx, req)
}

// AwaitEndpoints returns once pool has a ready endpoint: at once when it
// has one or there is no waiting room (NoEndpointTTL zero), else when one
// comes. It returns a 503 *Error when none came within NoEndpointTTL, and
// ctx's error as soon as ctx is done. A caller that asks the scheduler for
// req's endpoints before Admit waits here first.
func (c *Controller) AwaitEndpoints(ctx context.Context, pool *datastore.Pool, req Request) error {
	if pool.Endpoints().Len() > 0 || c.opts.NoEndpointTTL == 0 {
		return nil
	}
	pq := c.queue(pool)
	if pq == nil {
		return errRemoved(pool)
	}
	return pq.awaitEndpoints(ctx, req)
}

// Wake has pool's queue look at its saturation again: a scrape of one of
// its servers was published. It returns at once.
func (c *Controller) Wake(pool *datastore.Pool) {
	if v, ok := c.pools.Load(pool); ok {
		v.(*poolQueue).wake()
	}
}

// EndpointsChanged implements datastore.Observer: new endpoints release
// the waiting room and may free slots.
func (c *Controller) EndpointsChanged(pool *datastore.Pool, _, _ []*datastore.Endpoint) { c.Wake(pool) }

// PoolRemoved implements datastore.Observer: the pool's waiting requests
// are answered 503 at once and its series deleted.
func (c *Controller) PoolRemoved(pool *datastore.Pool) {
	v, ok := c.pools.LoadAndDelete(pool)
	if !ok {
		return
	}
	v.(*poolQueue).remove()
	c.m.forget(pool.Key)
	c.bytes.Forget(pool.Key.Namespace, pool.Key.Name)
}

func (c *Controller) queue(pool *datastore.Pool) *poolQueue {
	if v, ok := c.pools.Load(pool); ok {
		return v.(*poolQueue)
	}
	if pool.Removed() {
		return nil
	}
	name := pool.Key.String()
	v, loaded := c.pools.LoadOrStore(pool, &poolQueue{c: c, pool: pool, name: name, room: newWaitingRoom(c.m.waitingRoom.WithLabelValues(pool.Key.Namespace, pool.Key.Name)),
		bytes: c.bytes.Party(pool.Key.Namespace, pool.Key.Name)})
	if !loaded && pool.Removed() {
		// PoolRemoved may have run before the store: keep nothing for a
		// pool that is gone.
		c.pools.Delete(pool)
		return nil
	}
	return v.(*poolQueue)
}

func errRemoved(pool *datastore.Pool) *Error {
	return &Error{Code: http.StatusServiceUnavailable, Reason: ReasonPoolRemoved, Message: "pool " + pool.Key.String() + " is no longer served"}
}

// Ticket is an admitted request's hold on its pool's queue.
type Ticket struct {
	pq *poolQueue
	// reserved: the queue released this request and waits for its pick
	// before it releases the next.
	reserved bool
	// to is the endpoint the request goes to.
	to           *datastore.Endpoint
	picked, done atomic.Bool
}

// Endpoint is the endpoint the queue gave the request: its preferred one,
// or an idle one that took it while the preferred one was busy. Nil when
// flow control chose none (the pool had no endpoint and no waiting room):
// the scheduler's pick stands. A nil Ticket has none.
func (t *Ticket) Endpoint() *datastore.Endpoint {
	if t == nil {
		return nil
	}
	return t.to
}

// Picked tells the queue the request's pick is over (its in-flight count
// added, or the pick failed): the queue may release its next request.
// Later calls do nothing; a nil Ticket does nothing.
func (t *Ticket) Picked() {
	if t == nil || !t.picked.CompareAndSwap(false, true) || !t.reserved {
		return
	}
	pq := t.pq
	pq.mu.Lock()
	pq.reserved = false
	pq.dispatchLocked()
	pq.mu.Unlock()
}

// Done tells the queue the request finished (its in-flight count taken
// down): a slot may be free. It implies Picked. Later calls do nothing; a
// nil Ticket does nothing.
func (t *Ticket) Done() {
	if t == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	t.Picked()
	t.pq.wake()
}
