// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/scheduling"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a controller over the real scheduler's saturation detector
// and pools whose endpoints have a fresh scrape saying idle: with a
// queue-depth threshold of 1, one request in flight takes an endpoint's
// only slot, so a test frees a slot by finishing a request.
type fixture struct {
	reg   *datastore.Registry
	sched *scheduling.Scheduler
	c     *flowcontrol.Controller
	prom  *prometheus.Registry
}

func newFixture(t *testing.T, opts flowcontrol.Options) *fixture {
	t.Helper()
	return newFixtureWith(t, opts, false)
}

// newFixtureWith is newFixture, with the scheduler's
// EndpointStartsAtOnce when startsAtOnce.
func newFixtureWith(t *testing.T, opts flowcontrol.Options, startsAtOnce bool) *fixture {
	t.Helper()
	sched, err := scheduling.New(nil, scheduling.Options{QueueDepthThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{reg: datastore.NewRegistry(), sched: sched, prom: prometheus.NewRegistry()}
	fx.reg.AddObserver(sched)
	opts.EndpointSaturated, opts.Registerer = sched.EndpointSaturated, fx.prom
	if startsAtOnce {
		opts.EndpointStartsAtOnce = sched.EndpointStartsAtOnce
	}
	if fx.c, err = flowcontrol.New(opts); err != nil {
		t.Fatal(err)
	}
	fx.reg.AddObserver(fx.c)
	return fx
}

// pool adds pool name with n endpoints, each with an idle fresh scrape.
func (fx *fixture) pool(name string, n int) *datastore.Pool {
	p := fx.reg.Upsert(types.NamespacedName{Namespace: "ns", Name: name}, &datastore.PoolSpec{
		Selector: map[string]string{"app": name}, TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9002})
	var pods []datastore.EndpointSource
	for i := 0; i < n; i++ {
		pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("%s-%d", name, i)},
			UID: types.UID(fmt.Sprintf("%s-uid-%d", name, i)), IP: fmt.Sprintf("10.0.0.%d", i+1)})
	}
	p.SetPods(pods)
	p.SetSynced(true)
	for _, e := range p.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{ScrapedAt: time.Now(), Interval: time.Hour})
	}
	return p
}

// admitted is a request flow control let through, holding the endpoint it
// was placed on (as extproc holds the pick's in-flight count).
type admitted struct {
	name string
	t    *flowcontrol.Ticket
	e    *datastore.Endpoint
	err  error
}

// admit runs Admit for req in its own goroutine, as a stream does; once
// admitted, the request takes a free slot and is picked. The result goes
// to out.
func (fx *fixture) admit(ctx context.Context, p *datastore.Pool, name string, req flowcontrol.Request, out chan<- admitted) {
	req.ID = name
	go func() {
		t, err := fx.c.Admit(ctx, p, req)
		a := admitted{name: name, t: t, err: err}
		if err == nil {
			a.e = t.Endpoint()
			if a.e == nil {
				a.e = fx.place(p)
			}
			if a.e != nil {
				a.e.AddInFlight(1)
			}
			t.Picked()
		}
		out <- a
	}()
}

// place is the endpoint an admitted request takes: the first with its
// slot free (none in flight).
func (fx *fixture) place(p *datastore.Pool) *datastore.Endpoint {
	for _, e := range p.Endpoints().Endpoints {
		if e.InFlight() == 0 {
			return e
		}
	}
	return nil
}

// finish ends an admitted request: its slot frees.
func (a admitted) finish() {
	if a.e != nil {
		a.e.AddInFlight(-1)
	}
	a.t.Done()
}

// queued waits until p's queue holds n requests.
func (fx *fixture) queued(t *testing.T, p *datastore.Pool, n int) {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("%d requests queued in %s", n, p.Key), func() bool {
		return fx.metric("inference_extension_flow_control_queue_size", p) == float64(n)
	})
}

// metric sums the series of the named metric for pool p.
func (fx *fixture) metric(name string, p *datastore.Pool) float64 {
	return promtest.PoolSum(fx.prom, name, p.Key.Namespace, p.Key.Name)
}

// fill admits one request per endpoint of p (each takes a slot) and returns
// them.
func (fx *fixture) fill(t *testing.T, p *datastore.Pool) []admitted {
	t.Helper()
	out := make(chan admitted, 1)
	var got []admitted
	for i := range p.Endpoints().Endpoints {
		fx.admit(context.Background(), p, fmt.Sprintf("fill-%d", i), flowcontrol.Request{}, out)
		a := <-out
		if a.err != nil || a.e == nil {
			t.Fatalf("filling %s: %+v", p.Key, a)
		}
		got = append(got, a)
	}
	if !fx.sched.PoolSaturated(p) {
		t.Fatalf("pool %s not saturated after one request per endpoint", p.Key)
	}
	return got
}

type queuedReq struct {
	name     string
	flow     string
	priority int
}

// TestReleaseOrder: requests queued while the pool is saturated leave by
// band (highest priority first, in order of arrival within a flow) and in
// turn between the flows of a band, whatever their arrival order; each
// freed slot releases exactly one.
func TestReleaseOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		reqs []queuedReq
		want []string
	}{
		{
			name: "bands",
			reqs: []queuedReq{{"batch-1", "batch", -1}, {"std-1", "std", 0}, {"high-1", "high", 10}, {"std-2", "std", 0}, {"batch-2", "batch", -1}, {"high-2", "high", 10}},
			want: []string{"high-1", "high-2", "std-1", "std-2", "batch-1", "batch-2"},
		},
		{
			name: "flows in turn",
			reqs: []queuedReq{{"a-1", "a", 0}, {"a-2", "a", 0}, {"a-3", "a", 0}, {"a-4", "a", 0}, {"a-5", "a", 0}, {"a-6", "a", 0}, {"b-1", "b", 0}, {"b-2", "b", 0}},
			want: []string{"a-1", "b-1", "a-2", "b-2", "a-3", "a-4", "a-5", "a-6"},
		},
		{
			name: "flows in turn within their band",
			reqs: []queuedReq{{"a-1", "a", 0}, {"a-2", "a", 0}, {"low-1", "low", -1}, {"b-1", "b", 0}, {"a-3", "a", 0}, {"c-1", "c", 0}},
			want: []string{"a-1", "b-1", "c-1", "a-2", "a-3", "low-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, flowcontrol.Options{})
			p := fx.pool("p", 1)
			running := fx.fill(t, p)[0]
			out := make(chan admitted, len(tc.reqs))
			for i, r := range tc.reqs {
				fx.admit(context.Background(), p, r.name, flowcontrol.Request{Flow: r.flow, Priority: r.priority, Bytes: 10}, out)
				fx.queued(t, p, i+1)
			}
			if got := fx.c.QueuedBytes(); got != int64(10*len(tc.reqs)) {
				t.Fatalf("queued bytes %d, want %d", got, 10*len(tc.reqs))
			}
			var order []string
			for range tc.reqs {
				running.finish()
				running = <-out
				if running.err != nil {
					t.Fatalf("%s: %v", running.name, running.err)
				}
				order = append(order, running.name)
				select {
				case extra := <-out:
					t.Fatalf("one freed slot released %s and %s", running.name, extra.name)
				default:
				}
			}
			running.finish()
			if fmt.Sprint(order) != fmt.Sprint(tc.want) {
				t.Fatalf("released %v, want %v", order, tc.want)
			}
			if got := fx.c.QueuedBytes(); got != 0 {
				t.Fatalf("queued bytes %d after every release, want 0", got)
			}
			if got := fx.metric("inference_extension_flow_control_dispatched_total", p); got != float64(len(tc.reqs)) {
				t.Fatalf("dispatched_total %v, want %d", got, len(tc.reqs))
			}
		})
	}
}

// TestFairShares: two flows of one band, one offered three times the
// other's requests, are served 1:1 while both have requests waiting.
func TestFairShares(t *testing.T) {
	fx := newFixture(t, flowcontrol.Options{})
	p := fx.pool("p", 1)
	running := fx.fill(t, p)[0]
	out := make(chan admitted, 40)
	flows := map[string]string{}
	for i := 0; i < 40; i++ {
		f := "a"
		if i%4 == 3 {
			f = "b"
		}
		name := fmt.Sprintf("%s-%d", f, i)
		flows[name] = f
		fx.admit(context.Background(), p, name, flowcontrol.Request{Flow: f}, out)
		fx.queued(t, p, i+1)
	}
	served := map[string]int{}
	for i := 0; i < 20; i++ { // b has 10 waiting: both stay backlogged
		running.finish()
		running = <-out
		served[flows[running.name]]++
	}
	if served["a"] != 10 || served["b"] != 10 {
		t.Fatalf("while both flows waited: served %v, want 10 each", served)
	}
	for i := 0; i < 20; i++ {
		running.finish()
		running = <-out
	}
	running.finish()
}

// TestLimits: what exceeds a band's request or byte limit, or the
// process-wide byte bound over every pool, is refused 429 with the reason,
// and counted; other bands and pools are not held by it, and the bytes
// come back when requests leave.
func TestLimits(t *testing.T) {
	type step struct {
		pool     string
		priority int
		bytes    int64
		reason   string // "" queued
	}
	for _, tc := range []struct {
		name  string
		opts  flowcontrol.Options
		steps []step
	}{
		{
			name:  "band requests",
			opts:  flowcontrol.Options{MaxBandRequests: 2},
			steps: []step{{"p", 0, 1, ""}, {"p", 0, 1, ""}, {"p", 0, 1, flowcontrol.ReasonQueueFull}, {"p", -1, 1, ""}, {"q", 0, 1, ""}},
		},
		{
			name:  "band bytes",
			opts:  flowcontrol.Options{MaxBandBytes: 100},
			steps: []step{{"p", 0, 60, ""}, {"p", 0, 41, flowcontrol.ReasonQueueFull}, {"p", 0, 40, ""}, {"p", 1, 100, ""}},
		},
		{
			name:  "process bytes over pools",
			opts:  flowcontrol.Options{MaxQueuedBytes: 100, FairShareReservePercent: -1},
			steps: []step{{"p", 0, 60, ""}, {"q", 0, 41, flowcontrol.ReasonQueueBytesExceeded}, {"q", 0, 40, ""}, {"p", 5, 1, flowcontrol.ReasonQueueBytesExceeded}},
		},
		{
			// p's backlog alone takes all but the reserve, which q, new,
			// then has: one pool's backlog cannot refuse another's requests.
			name:  "process bytes shared fairly",
			opts:  flowcontrol.Options{MaxQueuedBytes: 100},
			steps: []step{{"p", 0, 90, ""}, {"p", 0, 10, flowcontrol.ReasonQueueBytesExceeded}, {"q", 0, 10, ""}, {"q", 1, 1, flowcontrol.ReasonQueueBytesExceeded}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, tc.opts)
			pools := map[string]*datastore.Pool{"p": fx.pool("p", 1), "q": fx.pool("q", 1)}
			var running []admitted
			for _, p := range pools {
				running = append(running, fx.fill(t, p)...)
			}
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan admitted, len(tc.steps))
			queued := map[string]int{}
			var want int64
			for i, s := range tc.steps {
				p := pools[s.pool]
				fx.admit(ctx, p, fmt.Sprint(i), flowcontrol.Request{Priority: s.priority, Bytes: s.bytes}, out)
				if s.reason == "" {
					queued[s.pool]++
					want += s.bytes
					fx.queued(t, p, queued[s.pool])
					continue
				}
				a := <-out
				var fe *flowcontrol.Error
				if !errors.As(a.err, &fe) || fe.Code != http.StatusTooManyRequests || fe.Reason != s.reason {
					t.Fatalf("step %d (%+v): got %v, want 429 %s", i, s, a.err, s.reason)
				}
				if got := fx.metric("inference_extension_flow_control_rejected_total", p); got < 1 {
					t.Fatalf("step %d: rejected_total %v, want it counted", i, got)
				}
			}
			if got := fx.c.QueuedBytes(); got != want {
				t.Fatalf("queued bytes %d, want %d", got, want)
			}
			cancel() // every queued client goes away
			for _, n := range queued {
				for ; n > 0; n-- {
					if a := <-out; !errors.Is(a.err, context.Canceled) {
						t.Fatalf("queued request %s: %v, want context.Canceled", a.name, a.err)
					}
				}
			}
			if got := fx.c.QueuedBytes(); got != 0 {
				t.Fatalf("queued bytes %d after every client left, want 0", got)
			}
			for _, a := range running {
				a.finish()
			}
		})
	}
}

// TestQueueTTL: a request the pool does not release within the queue TTL
// is answered 429 QueueTTLExpired, leaves the queue with its bytes, and the
// expiry is counted; the next request still gets the freed slot.
func TestQueueTTL(t *testing.T) {
	fx := newFixture(t, flowcontrol.Options{QueueTTL: 50 * time.Millisecond})
	p := fx.pool("p", 1)
	running := fx.fill(t, p)[0]
	out := make(chan admitted, 1)
	start := time.Now()
	fx.admit(context.Background(), p, "late", flowcontrol.Request{Bytes: 7}, out)
	a := <-out
	var fe *flowcontrol.Error
	if !errors.As(a.err, &fe) || fe.Code != http.StatusTooManyRequests || fe.Reason != flowcontrol.ReasonQueueTTLExpired {
		t.Fatalf("got %v, want 429 %s", a.err, flowcontrol.ReasonQueueTTLExpired)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("refused after %v, before the TTL", waited)
	}
	if fx.c.QueuedBytes() != 0 || fx.metric("inference_extension_flow_control_queue_size", p) != 0 {
		t.Fatalf("the expired request stayed queued: %d bytes", fx.c.QueuedBytes())
	}
	if got := fx.metric("inference_extension_flow_control_rejected_total", p); got != 1 {
		t.Fatalf("rejected_total %v, want 1 (the expiry)", got)
	}
	running.finish()
	fx.admit(context.Background(), p, "next", flowcontrol.Request{}, out)
	if a := <-out; a.err != nil {
		t.Fatalf("after the slot freed: %v", a.err)
	} else {
		a.finish()
	}
}

// TestSheddableWaitsBehindCritical: a sheddable request that came first
// waits behind a critical one that came later, takes no slot while the
// critical one holds it, and is the one the queue TTL refuses (429); the
// critical one is served.
func TestSheddableWaitsBehindCritical(t *testing.T) {
	fx := newFixture(t, flowcontrol.Options{QueueTTL: time.Second})
	p := fx.pool("p", 1)
	running := fx.fill(t, p)[0]
	shed, crit := make(chan admitted, 1), make(chan admitted, 1)
	fx.admit(context.Background(), p, "batch", flowcontrol.Request{Flow: "batch", Priority: -1, Bytes: 5}, shed)
	fx.queued(t, p, 1)
	fx.admit(context.Background(), p, "interactive", flowcontrol.Request{Flow: "interactive", Bytes: 5}, crit)
	fx.queued(t, p, 2)
	running.finish()
	c := <-crit
	if c.err != nil {
		t.Fatalf("critical request: %v", c.err)
	}
	defer c.finish()
	s := <-shed
	var fe *flowcontrol.Error
	if !errors.As(s.err, &fe) || fe.Code != http.StatusTooManyRequests || fe.Reason != flowcontrol.ReasonQueueTTLExpired {
		t.Fatalf("sheddable request got %v, want 429 %s while the critical one holds the slot", s.err, flowcontrol.ReasonQueueTTLExpired)
	}
	if got := fx.metric("inference_extension_flow_control_rejected_total", p); got != 1 {
		t.Fatalf("rejected_total %v, want 1 (the sheddable expiry)", got)
	}
}

// TestServerQueueKeptForTopBand: a server running as many requests as it
// can, with its one waiting place (the queue-depth threshold) free. With
// EndpointStartsAtOnce, once the pool has had a critical request, a
// sheddable one waits in the picker for a running slot and a critical one
// takes the waiting place at once; without it, or while the pool has had
// sheddable requests only, the sheddable one takes the waiting place.
func TestServerQueueKeptForTopBand(t *testing.T) {
	for _, tc := range []struct {
		name          string
		startsAtOnce  bool
		criticalFirst bool
		wantHeld      bool
	}{
		{name: "kept for the critical band", startsAtOnce: true, criticalFirst: true, wantHeld: true},
		{name: "without EndpointStartsAtOnce", startsAtOnce: false, criticalFirst: true},
		{name: "sheddable requests only so far", startsAtOnce: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixtureWith(t, flowcontrol.Options{}, tc.startsAtOnce)
			p := fx.pool("p", 1)
			e := p.Endpoints().Endpoints[0]
			// Four requests running; a scrape showed one more waiting (the
			// server runs four at once), the last shows none.
			e.AddInFlight(4)
			e.SetMetrics(&datastore.Metrics{RunningRequests: 4, WaitingRequests: 1, ScrapedAt: time.Now(), Interval: time.Hour})
			e.SetMetrics(&datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now(), Interval: time.Hour})
			if fx.sched.EndpointSaturated(e) || fx.sched.EndpointStartsAtOnce(e) {
				t.Fatalf("endpoint saturated %v, starts at once %v; want a free waiting place and no free running slot",
					fx.sched.EndpointSaturated(e), fx.sched.EndpointStartsAtOnce(e))
			}
			// admit runs a request as a stream does: it holds the endpoint
			// once admitted.
			admit := func(name string, priority int) <-chan *flowcontrol.Ticket {
				got := make(chan *flowcontrol.Ticket, 1)
				go func() {
					tk, err := fx.c.Admit(context.Background(), p, flowcontrol.Request{ID: name, Priority: priority, Bytes: 1})
					if err != nil {
						t.Errorf("%s: %v", name, err)
						close(got)
						return
					}
					e.AddInFlight(1)
					tk.Picked()
					got <- tk
				}()
				return got
			}
			finish := func(tk *flowcontrol.Ticket) {
				e.AddInFlight(-1)
				tk.Done()
			}
			if tc.criticalFirst {
				finish(<-admit("critical-1", 0))
			}
			shed := admit("sheddable", -1)
			if !tc.wantHeld {
				finish(<-shed)
				return
			}
			fx.queued(t, p, 1)
			crit := <-admit("critical-2", 0)
			if got := fx.metric("inference_extension_flow_control_queue_size", p); got != 1 {
				t.Fatalf("queue size %v after the critical request took the waiting place, want the sheddable one still held", got)
			}
			// A running request ends: the critical one runs in its slot,
			// the server is full again and the sheddable one stays.
			e.AddInFlight(-1)
			// The critical one ends: a running slot is free.
			finish(crit)
			finish(<-shed)
		})
	}
}

// TestClientGone: a queued request whose client goes away leaves the queue
// at once (its bytes released, counted as canceled) and does not take the
// next slot from the request behind it.
func TestClientGone(t *testing.T) {
	fx := newFixture(t, flowcontrol.Options{})
	p := fx.pool("p", 1)
	running := fx.fill(t, p)[0]
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan admitted, 2)
	fx.admit(ctx, p, "gone", flowcontrol.Request{Bytes: 5}, out)
	fx.queued(t, p, 1)
	fx.admit(context.Background(), p, "stays", flowcontrol.Request{Bytes: 5}, out)
	fx.queued(t, p, 2)
	cancel()
	if a := <-out; a.name != "gone" || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("got %s %v, want gone: context.Canceled", a.name, a.err)
	}
	fx.queued(t, p, 1)
	if got := fx.c.QueuedBytes(); got != 5 {
		t.Fatalf("queued bytes %d, want 5 (the request that stays)", got)
	}
	running.finish()
	a := <-out
	if a.name != "stays" || a.err != nil {
		t.Fatalf("the freed slot went to %s (%v), want stays", a.name, a.err)
	}
	a.finish()
}

// TestWaitingRoom: a request to a pool without endpoints waits for one
// (Options.Waiting told once, the gauge set) and goes on when pods come
// (Options.Drained told once); a request whose pods never come is answered
// 503 NoEndpointsTimeout after the room's TTL, and Drained told.
func TestWaitingRoom(t *testing.T) {
	waiting, drained := make(chan string, 4), make(chan string, 4)
	fx := newFixture(t, flowcontrol.Options{NoEndpointTTL: time.Minute,
		Waiting: func(p *datastore.Pool) { waiting <- p.Key.Name }, Drained: func(p *datastore.Pool) { drained <- p.Key.Name }})
	p := fx.pool("p", 0)
	out := make(chan admitted, 2)
	fx.admit(context.Background(), p, "first", flowcontrol.Request{Bytes: 3}, out)
	fx.admit(context.Background(), p, "second", flowcontrol.Request{Bytes: 3}, out)
	if got := <-waiting; got != "p" {
		t.Fatalf("Waiting told of %s, want p", got)
	}
	poll.Until(t, 10*time.Second, "two requests in the waiting room", func() bool {
		return fx.metric("inference_extension_flow_control_waiting_room_requests", p) == 2
	})
	p.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "ns", Name: "p-0"}, UID: "p-uid-0", IP: "10.0.0.1"},
		{Pod: types.NamespacedName{Namespace: "ns", Name: "p-1"}, UID: "p-uid-1", IP: "10.0.0.2"}})
	for _, e := range p.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{ScrapedAt: time.Now(), Interval: time.Hour})
	}
	for i := 0; i < 2; i++ {
		a := <-out
		if a.err != nil || a.e == nil {
			t.Fatalf("after pods came: %s %v", a.name, a.err)
		}
		defer a.finish()
	}
	if len(waiting) != 0 {
		t.Fatalf("Waiting told again while the room was occupied")
	}
	if got := <-drained; got != "p" || len(drained) != 0 {
		t.Fatalf("Drained told of %s (%d more), want p once", got, len(drained))
	}
	if fx.metric("inference_extension_flow_control_waiting_room_requests", p) != 0 || fx.c.QueuedBytes() != 0 {
		t.Fatalf("the room kept its requests")
	}

	short := newFixture(t, flowcontrol.Options{NoEndpointTTL: 30 * time.Millisecond, Drained: func(p *datastore.Pool) { drained <- p.Key.Name }})
	empty := short.pool("empty", 0)
	short.admit(context.Background(), empty, "never", flowcontrol.Request{}, out)
	var fe *flowcontrol.Error
	if a := <-out; !errors.As(a.err, &fe) || fe.Code != http.StatusServiceUnavailable || fe.Reason != flowcontrol.ReasonNoEndpointsTimeout {
		t.Fatalf("got %v, want 503 %s", a.err, flowcontrol.ReasonNoEndpointsTimeout)
	}
	if got := <-drained; got != "empty" {
		t.Fatalf("Drained told of %s after the TTL, want empty", got)
	}
}

// TestPoolsIsolated: one pool's backlog holds no request of another pool,
// and a removed pool's queued requests are answered 503 PoolRemoved at once.
func TestPoolsIsolated(t *testing.T) {
	fx := newFixture(t, flowcontrol.Options{})
	busy, free := fx.pool("busy", 1), fx.pool("free", 1)
	running := fx.fill(t, busy)
	out := make(chan admitted, 8)
	for i := 0; i < 5; i++ {
		fx.admit(context.Background(), busy, fmt.Sprint("busy-", i), flowcontrol.Request{}, out)
	}
	fx.queued(t, busy, 5)
	fx.admit(context.Background(), free, "free", flowcontrol.Request{}, out)
	if a := <-out; a.name != "free" || a.err != nil {
		t.Fatalf("got %s %v, want free admitted past the other pool's backlog", a.name, a.err)
	} else {
		a.finish()
	}
	fx.reg.Remove(busy.Key)
	for i := 0; i < 5; i++ {
		var fe *flowcontrol.Error
		if a := <-out; !errors.As(a.err, &fe) || fe.Code != http.StatusServiceUnavailable || fe.Reason != flowcontrol.ReasonPoolRemoved {
			t.Fatalf("%s: got %v, want 503 %s", a.name, a.err, flowcontrol.ReasonPoolRemoved)
		}
	}
	if fx.c.QueuedBytes() != 0 {
		t.Fatalf("queued bytes %d after the pool went", fx.c.QueuedBytes())
	}
	for _, a := range running {
		a.finish()
	}
}

// TestEndpointChoice: a request goes to the endpoint it prefers (the
// scheduler's pick) while that one has a free slot; while it is busy, the
// request waits for it even when another endpoint has a free slot, unless
// that one is idle (nothing in flight) or the request has waited
// StealAfter; a request whose preferred endpoint left the pool goes to any
// free one.
func TestEndpointChoice(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts flowcontrol.Options
		// running is each endpoint's scrape's running requests, inFlight
		// the picker's requests in flight to it: with a queue-depth
		// threshold of 1, in flight beyond running saturates.
		running, inFlight [2]int64
		prefer            int  // index of the preferred endpoint, -1: one that left the pool
		wantWait          bool // queued until endpoint 0 frees a slot
		want              int  // endpoint it goes to
	}{
		{name: "preferred free", inFlight: [2]int64{0, 0}, prefer: 1, want: 1},
		{name: "preferred busy, other idle", inFlight: [2]int64{1, 0}, prefer: 0, want: 1},
		{name: "preferred busy, other free but busy", running: [2]int64{0, 2}, inFlight: [2]int64{1, 1}, prefer: 0, wantWait: true, want: 0},
		{name: "StealBelow 2 takes the other", opts: flowcontrol.Options{StealBelow: 2}, running: [2]int64{0, 2}, inFlight: [2]int64{1, 1}, prefer: 0, want: 1},
		{name: "StealAfter passes", opts: flowcontrol.Options{StealAfter: 20 * time.Millisecond}, running: [2]int64{0, 2}, inFlight: [2]int64{1, 1}, prefer: 0, want: 1},
		{name: "preferred left the pool", running: [2]int64{0, 2}, inFlight: [2]int64{1, 1}, prefer: -1, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, tc.opts)
			p := fx.pool("p", 2)
			eps := p.Endpoints().Endpoints
			for i, e := range eps {
				e.AddInFlight(tc.inFlight[i])
				e.SetMetrics(&datastore.Metrics{ScrapedAt: time.Now(), Interval: time.Hour, RunningRequests: int(tc.running[i])})
			}
			gone := fx.pool("gone", 1).Endpoints().Endpoints[0]
			pref := gone
			if tc.prefer >= 0 {
				pref = eps[tc.prefer]
			}
			start := time.Now()
			ch := make(chan *flowcontrol.Ticket, 1)
			errc := make(chan error, 1)
			go func() {
				tk, err := fx.c.Admit(context.Background(), p, flowcontrol.Request{ID: "r", Endpoints: []*datastore.Endpoint{pref}})
				if err != nil {
					errc <- err
					return
				}
				ch <- tk
			}()
			if tc.wantWait {
				fx.queued(t, p, 1)
				eps[0].AddInFlight(-1)
				fx.c.Wake(p)
			}
			var tk *flowcontrol.Ticket
			select {
			case tk = <-ch:
			case err := <-errc:
				t.Fatal(err)
			}
			defer tk.Done()
			tk.Picked()
			if got := tk.Endpoint(); got == nil || got.Key() != eps[tc.want].Key() {
				t.Fatalf("went to %v, want endpoint %d (%s)", got, tc.want, eps[tc.want].Address)
			}
			if d := tc.opts.StealAfter; d > 0 && time.Since(start) < d {
				t.Fatalf("taken by another endpoint after %v, before StealAfter %v", time.Since(start), d)
			}
		})
	}
}

// TestFlowsServedInTurnAcrossEndpoints: slots free only on endpoint 0
// (endpoint 1 stays busy). A flow that is served less than another takes
// the free slot even when its requests wait for endpoint 1, rather than let
// the flow ahead take it: flows of one band are served one for one
// wherever their requests wait; a single flow waits for its endpoint. While waiting,
// each request counts as held on the endpoint it waits for, at its
// priority, and its Queued callback has run.
func TestFlowsServedInTurnAcrossEndpoints(t *testing.T) {
	type qr struct {
		name, flow string
		prefer     int
	}
	for _, tc := range []struct {
		name     string
		reqs     []qr
		releases int
		want     []string
	}{
		{
			name:     "one flow waits for its endpoint",
			reqs:     []qr{{"a-1", "a", 0}, {"a-2", "a", 1}, {"a-3", "a", 0}},
			releases: 2,
			want:     []string{"a-1", "a-3"},
		},
		{
			name:     "a flow served less takes the slot only a flow ahead could use",
			reqs:     []qr{{"a-1", "a", 0}, {"a-2", "a", 0}, {"a-3", "a", 0}, {"a-4", "a", 0}, {"b-1", "b", 1}, {"b-2", "b", 1}},
			releases: 5,
			want:     []string{"a-1", "b-1", "a-2", "b-2", "a-3"},
		},
		{
			name:     "a flow served less takes its own request for the free endpoint first",
			reqs:     []qr{{"a-1", "a", 0}, {"a-2", "a", 0}, {"a-3", "a", 0}, {"b-1", "b", 1}, {"b-2", "b", 0}},
			releases: 4,
			want:     []string{"a-1", "b-2", "a-2", "b-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx, p, eps := twoEndpoints(t, flowcontrol.Options{}, 3)
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan admitted, len(tc.reqs))
			var queuedCalls atomic.Int32
			for i, r := range tc.reqs {
				fx.admit(ctx, p, r.name, flowcontrol.Request{Flow: r.flow, Endpoints: []*datastore.Endpoint{eps[r.prefer]},
					Queued: func() { queuedCalls.Add(1) }}, out)
				fx.queued(t, p, i+1)
			}
			// A request is counted in the queue just before its Queued
			// callback runs, on its own goroutine.
			poll.Until(t, 10*time.Second, fmt.Sprintf("Queued called %d times", len(tc.reqs)), func() bool {
				return queuedCalls.Load() == int32(len(tc.reqs))
			})
			for i := range eps {
				want := int64(0)
				for _, r := range tc.reqs {
					if r.prefer == i {
						want++
					}
				}
				if got := eps[i].HeldAtOrAbove(0); got != want {
					t.Fatalf("endpoint %d holds %d, want %d", i, got, want)
				}
				if got := eps[i].HeldAtOrAbove(1); got != 0 {
					t.Fatalf("endpoint %d holds %d of priority 1 and above, want 0", i, got)
				}
			}
			fx.releaseOn(t, p, eps[0], out, tc.want)
			held := eps[0].HeldAtOrAbove(0) + eps[1].HeldAtOrAbove(0)
			if want := int64(len(tc.reqs) - tc.releases); held != want {
				t.Fatalf("%d held after the releases, want %d", held, want)
			}
			cancel()
			for range len(tc.reqs) - tc.releases {
				if a := <-out; a.err == nil {
					t.Fatalf("%s released after its client left", a.name)
				}
			}
			if held := eps[0].HeldAtOrAbove(math.MinInt) + eps[1].HeldAtOrAbove(math.MinInt); held != 0 {
				t.Fatalf("%d held after every request left", held)
			}
		})
	}
}

// twoEndpoints is a fixture with pool "p" of two endpoints. Endpoint 0's
// scrape says 2 running: with 3 in flight it has one waiting (saturated),
// with 2 a free slot but is not idle (nothing is stolen for it); it starts
// with inFlight0. Endpoint 1 has one waiting throughout.
func twoEndpoints(t *testing.T, opts flowcontrol.Options, inFlight0 int64) (*fixture, *datastore.Pool, []*datastore.Endpoint) {
	t.Helper()
	fx := newFixture(t, opts)
	p := fx.pool("p", 2)
	eps := p.Endpoints().Endpoints
	eps[0].SetMetrics(&datastore.Metrics{ScrapedAt: time.Now(), Interval: time.Hour, RunningRequests: 2})
	eps[0].AddInFlight(inFlight0)
	eps[1].AddInFlight(1)
	return fx, p, eps
}

// releaseOn frees one slot of e at a time, len(want) times, and checks that
// the requests released, each to e, are want in order.
func (fx *fixture) releaseOn(t *testing.T, p *datastore.Pool, e *datastore.Endpoint, out <-chan admitted, want []string) {
	t.Helper()
	var order []string
	for range want {
		e.AddInFlight(-1)
		fx.c.Wake(p)
		a := <-out
		if a.err != nil {
			t.Fatalf("%s: %v", a.name, a.err)
		}
		if a.e.Key() != e.Key() {
			t.Fatalf("%s went to %s, want %s", a.name, a.e.Address, e.Address)
		}
		order = append(order, a.name)
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("released %v, want %v", order, want)
	}
}

// TestAffinity: with per-endpoint queues, a free slot goes to the waiting
// request whose prefix (Request.Affinity) the endpoint was sent among its
// last ones, before older requests it would miss on, and a request waiting
// for a busy endpoint takes a free one that was sent its prefix. An older
// request is passed over at most twice, and requests without a key are
// served oldest first. Endpoint 0 frees one slot per release and is never
// idle; endpoint 1 stays busy.
func TestAffinity(t *testing.T) {
	type qr struct {
		name   string
		key    uint64
		prefer int
	}
	for _, tc := range []struct {
		name string
		sent []uint64 // keys sent to endpoint 0 before, oldest first
		reqs []qr
		want []string
	}{
		{
			name: "warm before older cold ones",
			sent: []uint64{7},
			reqs: []qr{{"c-1", 1, 0}, {"c-2", 2, 0}, {"w-1", 7, 0}},
			want: []string{"w-1", "c-1", "c-2"},
		},
		{
			name: "any of the last keys is warm, oldest first among them",
			sent: []uint64{7, 8, 9},
			reqs: []qr{{"c-1", 1, 0}, {"w-8", 8, 0}, {"w-7", 7, 0}},
			want: []string{"w-8", "w-7", "c-1"},
		},
		{
			name: "a key sent before the last four is cold",
			sent: []uint64{7, 2, 3, 4, 5},
			reqs: []qr{{"c-1", 1, 0}, {"c-7", 7, 0}},
			want: []string{"c-1", "c-7"},
		},
		{
			name: "an older request is passed over at most twice",
			sent: []uint64{7},
			reqs: []qr{{"c-1", 1, 0}, {"w-1", 7, 0}, {"w-2", 7, 0}, {"w-3", 7, 0}},
			want: []string{"w-1", "w-2", "c-1", "w-3"},
		},
		{
			name: "without keys oldest first",
			sent: []uint64{0},
			reqs: []qr{{"a-1", 0, 0}, {"a-2", 0, 0}, {"a-3", 0, 0}},
			want: []string{"a-1", "a-2", "a-3"},
		},
		{
			name: "a request waiting for a busy endpoint takes a free one sent its prefix",
			sent: []uint64{7},
			reqs: []qr{{"c-1", 1, 1}, {"w-1", 7, 1}},
			want: []string{"w-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx, p, eps := twoEndpoints(t, flowcontrol.Options{PerEndpoint: true}, 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := make(chan admitted, len(tc.reqs)+len(tc.sent))
			for i, key := range tc.sent {
				fx.admit(ctx, p, fmt.Sprintf("sent-%d", i), flowcontrol.Request{Affinity: key, Endpoints: []*datastore.Endpoint{eps[0]}}, out)
				a := <-out
				if a.err != nil || a.e.Key() != eps[0].Key() {
					t.Fatalf("sending key %d: %+v", key, a)
				}
				a.finish() // keeps endpoint 0 at 2 in flight
			}
			eps[0].AddInFlight(1) // saturated
			for i, r := range tc.reqs {
				fx.admit(ctx, p, r.name, flowcontrol.Request{Flow: "f", Affinity: r.key, Endpoints: []*datastore.Endpoint{eps[r.prefer]}}, out)
				fx.queued(t, p, i+1)
			}
			fx.releaseOn(t, p, eps[0], out, tc.want)
			// What is left waits: a look at the saturated pool releases nothing.
			left := len(tc.reqs) - len(tc.want)
			fx.c.Wake(p)
			fx.queued(t, p, left)
			cancel()
			for range left {
				if a := <-out; a.err == nil {
					t.Fatalf("%s released after its client left", a.name)
				}
			}
		})
	}
}
