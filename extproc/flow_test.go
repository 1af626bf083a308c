// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/scheduling"
)

// flowFixture is a server with the real scheduler and a real flow
// controller over pools of one endpoint each, whose scrape says idle and
// stays fresh: with a queue-depth threshold of 1, one request in flight
// saturates a pool (EndpointSaturated counts the picker's in-flight requests
// beyond the scraped running ones), so a test decides when a slot frees by
// finishing a request.
type flowFixture struct {
	f    *poolFixture
	ts   *testServer
	fc   *flowcontrol.Controller
	prom *prometheus.Registry
}

func newFlowFixture(t *testing.T, pools int, fo flowcontrol.Options) *flowFixture {
	t.Helper()
	reg := datastore.NewRegistry()
	sched, err := scheduling.New(nil, scheduling.Options{QueueDepthThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(sched)
	prom := prometheus.NewRegistry()
	fo.EndpointSaturated, fo.Registerer = sched.EndpointSaturated, prom
	fc, err := flowcontrol.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(fc)
	f := &poolFixture{reg: reg}
	for i := 0; i < pools; i++ {
		p := f.add(i, poolNS(i), poolName(i), poolSvc(i), 9002, 1)
		idle(p)
		p.SetPolicy(&datastore.Policy{Objectives: map[string]int{"high": 10, "a": 0, "b": 0, "batch": -1}})
	}
	ts := startServer(t, reg, sched, Options{Insecure: true, FlowControl: fc, Registerer: prom})
	return &flowFixture{f: f, ts: ts, fc: fc, prom: prom}
}

// idle publishes a scrape of every endpoint of p saying it is idle, fresh
// for the test's length.
func idle(p *datastore.Pool) {
	for _, e := range p.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{ScrapedAt: time.Now(), Interval: time.Hour})
	}
}

// flowReq is one request on its own stream; answer receives the stream's
// first answer (the decision, or an immediate response) when it comes.
type flowReq struct {
	name   string
	g      *gw
	answer chan answer
}

type answer struct {
	name string
	// dest is the destination, or "" with code set for an immediate response.
	dest string
	code int
	body string
	err  error
}

// send starts a request to pool with the given extra headers; its answer
// goes to out.
func (fx *flowFixture) send(t *testing.T, pool int, name string, out chan answer, extra ...hdr) *flowReq {
	t.Helper()
	return fx.sendBody(t, pool, name, out, completionBody("m", 10), extra...)
}

// sendBody is send with the given request body.
func (fx *flowFixture) sendBody(t *testing.T, pool int, name string, out chan answer, body []byte, extra ...hdr) *flowReq {
	t.Helper()
	r := &flowReq{name: name, g: fx.ts.open(t, authorityOf(pool), nil), answer: out}
	extra = append(extra, hdr{"x-request-id", name, true})
	r.g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", extra...), false), duplex, duplex))
	r.g.send(reqBody(body, true))
	go func() {
		m, err := r.g.stream.Recv()
		a := answer{name: name, err: err}
		if ir := m.GetImmediateResponse(); ir != nil {
			a.code, a.body = int(ir.GetStatus().GetCode()), string(ir.GetBody())
		} else if err == nil {
			a.dest, _ = mutationHeader(m.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
		}
		out <- a
	}()
	return r
}

// finish ends a forwarded request's response: its slot frees.
func (r *flowReq) finish(t *testing.T) {
	t.Helper()
	r.g.recv() // the body answer
	r.g.send(respHeaders([]hdr{{":status", "200", true}}, true, ""))
	r.g.recv()
}

// queued waits until pool's queue holds n requests.
func (fx *flowFixture) queued(t *testing.T, pool, n int) {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("%d queued requests in pool %d", n, pool), func() bool {
		return fx.gauge("inference_extension_flow_control_queue_size", pool) == float64(n)
	})
}

// gauge sums the series of the named metric for pool i.
func (fx *flowFixture) gauge(name string, i int) float64 {
	return promtest.PoolSum(fx.prom, name, poolNS(i), poolName(i))
}

func await(t *testing.T, ch chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", a.name, a.err)
		}
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
	}
	return answer{}
}

// expectNone checks that a fresh look at the pool's saturation (what a
// published scrape does) releases nothing: Wake releases under the queue's
// lock, so the queue's gauges say at once what it did.
func (fx *flowFixture) expectNone(t *testing.T, ch chan answer, pool int) {
	t.Helper()
	size := fx.gauge("inference_extension_flow_control_queue_size", pool)
	room := fx.gauge("inference_extension_flow_control_waiting_room_requests", pool)
	fx.fc.Wake(fx.f.pools[pool])
	if s, r := fx.gauge("inference_extension_flow_control_queue_size", pool), fx.gauge("inference_extension_flow_control_waiting_room_requests", pool); s != size || r != room {
		t.Fatalf("a look at the saturated pool released requests: queue %v -> %v, waiting room %v -> %v", size, s, room, r)
	}
	select {
	case a := <-ch:
		t.Fatalf("%s answered while its pool is saturated: %+v", a.name, a)
	default:
	}
}

// serveInOrder frees one slot at a time and returns the order the queued
// requests were released in.
func serveInOrder(t *testing.T, first *flowReq, reqs map[string]*flowReq, ch chan answer) []string {
	t.Helper()
	var order []string
	cur := first
	for range reqs {
		cur.finish(t)
		a := await(t, ch)
		if a.dest == "" {
			t.Fatalf("%s: want a decision, got %d %s", a.name, a.code, a.body)
		}
		order = append(order, a.name)
		cur = reqs[a.name]
	}
	cur.finish(t)
	return order
}

// TestFlowControlOrder: queued requests are released strictly by band, and
// in turn between the flows of a band, each the moment a slot frees.
func TestFlowControlOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  flowcontrol.Options
		reqs  [][]hdr // in arrival order; name is the index
		names []string
		// pads are the requests' prompt lengths beyond "hello " (0: 10),
		// firstPad the first request's: equal pads, equal prompts.
		pads     []int
		firstPad int
		want     []string
	}{{
		name:  "bands by priority",
		reqs:  [][]hdr{{{hdrObjective, "batch", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "high", true}}, {}},
		names: []string{"batch", "a", "high", "none"},
		want:  []string{"high", "a", "none", "batch"},
	}, {
		name:  "flows of a band in turn (objectives)",
		reqs:  [][]hdr{{{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "b", true}}, {{hdrObjective, "b", true}}},
		names: []string{"a1", "a2", "a3", "b1", "b2"},
		want:  []string{"a1", "b1", "a2", "b2", "a3"},
	}, {
		name:  "bands by priority, per-endpoint queues",
		opts:  flowcontrol.Options{PerEndpoint: true},
		reqs:  [][]hdr{{{hdrObjective, "batch", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "high", true}}, {}},
		names: []string{"batch", "a", "high", "none"},
		want:  []string{"high", "a", "none", "batch"},
	}, {
		name:  "flows of a band in turn, per-endpoint queues",
		opts:  flowcontrol.Options{PerEndpoint: true},
		reqs:  [][]hdr{{{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "b", true}}, {{hdrObjective, "b", true}}},
		names: []string{"a1", "a2", "a3", "b1", "b2"},
		want:  []string{"a1", "b1", "a2", "b2", "a3"},
	}, {
		name:  "flows of a band in turn (flow header)",
		opts:  flowcontrol.Options{FlowHeader: "X-Tenant"},
		reqs:  [][]hdr{{{"x-tenant", "t1", true}}, {{"x-tenant", "t1", true}}, {{"x-tenant", "t2", true}}, {{"x-tenant", "t3", true}}},
		names: []string{"t1a", "t1b", "t2", "t3"},
		want:  []string{"t1a", "t2", "t3", "t1b"},
	}, {
		name:     "the prompt the endpoint was sent last before older ones, per-endpoint queues",
		opts:     flowcontrol.Options{PerEndpoint: true},
		reqs:     [][]hdr{{{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}, {{hdrObjective, "a", true}}},
		names:    []string{"other-1", "same", "other-2"},
		pads:     []int{20, 50, 30},
		firstPad: 50,
		want:     []string{"same", "other-1", "other-2"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFlowFixture(t, 1, tc.opts)
			ch := make(chan answer, len(tc.reqs)+1)
			pad := func(p int) []byte { return completionBody("m", cmp.Or(p, 10)) }
			first := fx.sendBody(t, 0, "first", ch, pad(tc.firstPad))
			if a := await(t, ch); a.dest == "" {
				t.Fatalf("first request: want a decision, got %d %s", a.code, a.body)
			}
			reqs := map[string]*flowReq{}
			for i, h := range tc.reqs {
				p := 0
				if i < len(tc.pads) {
					p = tc.pads[i]
				}
				reqs[tc.names[i]] = fx.sendBody(t, 0, tc.names[i], ch, pad(p), h...)
				fx.queued(t, 0, i+1)
			}
			fx.expectNone(t, ch, 0)
			if got := serveInOrder(t, first, reqs, ch); !slices.Equal(got, tc.want) {
				t.Fatalf("released %v, want %v", got, tc.want)
			}
			fx.queued(t, 0, 0)
			// The server releases a stream's in-flight count on the stream's
			// goroutine, after its client saw the answer end.
			eventually(t, "in flight 0 after every request finished", func() bool { return fx.f.totalInFlight() == 0 })
			if got := fx.gauge("inference_extension_flow_control_dispatched_total", 0); got != float64(len(tc.reqs)) {
				t.Fatalf("dispatched_total %v, want %d", got, len(tc.reqs))
			}
		})
	}
}

// TestFlowControlRefusals: what exceeds a bound is answered at once (429,
// the OpenAI-style body naming the reason), a wait past the TTL is answered
// 429, and a request whose client went away leaves the queue at once.
func TestFlowControlRefusals(t *testing.T) {
	body := int64(len(completionBody("m", 10)))

	t.Run("queue TTL", func(t *testing.T) {
		fx := newFlowFixture(t, 1, flowcontrol.Options{QueueTTL: 100 * time.Millisecond})
		ch := make(chan answer, 2)
		first := fx.send(t, 0, "first", ch)
		await(t, ch)
		fx.send(t, 0, "late", ch)
		a := await(t, ch)
		if a.code != 429 || !strings.Contains(a.body, flowcontrol.ReasonQueueTTLExpired) || !strings.Contains(a.body, `"type":`) {
			t.Fatalf("want 429 %s with an OpenAI error body, got %d %s", flowcontrol.ReasonQueueTTLExpired, a.code, a.body)
		}
		fx.queued(t, 0, 0)
		first.finish(t)
	})

	t.Run("band full", func(t *testing.T) {
		fx := newFlowFixture(t, 1, flowcontrol.Options{MaxBandRequests: 1})
		ch := make(chan answer, 3)
		first := fx.send(t, 0, "first", ch)
		await(t, ch)
		fx.send(t, 0, "queued", ch)
		fx.queued(t, 0, 1)
		fx.send(t, 0, "over", ch)
		if a := await(t, ch); a.name != "over" || a.code != 429 || !strings.Contains(a.body, flowcontrol.ReasonQueueFull) {
			t.Fatalf("want over answered 429 %s, got %+v", flowcontrol.ReasonQueueFull, a)
		}
		// Another band has its own limit.
		fx.send(t, 0, "high", ch, hdr{hdrObjective, "high", true})
		fx.queued(t, 0, 2)
		first.finish(t)
		if a := await(t, ch); a.name != "high" {
			t.Fatalf("want high released first, got %+v", a)
		}
	})

	t.Run("process-wide bytes, pools apart", func(t *testing.T) {
		fx := newFlowFixture(t, 3, flowcontrol.Options{MaxQueuedBytes: body + body/2})
		ch := make(chan answer, 8)
		first0 := fx.send(t, 0, "first0", ch)
		await(t, ch)
		first1 := fx.send(t, 1, "first1", ch)
		await(t, ch)
		fx.send(t, 0, "queued0", ch)
		fx.queued(t, 0, 1)
		if got := fx.fc.QueuedBytes(); got != body {
			t.Fatalf("queued bytes %d, want %d", got, body)
		}
		// Pool 1 is saturated too, and the budget is spent by pool 0.
		fx.send(t, 1, "over1", ch)
		if a := await(t, ch); a.name != "over1" || a.code != 429 || !strings.Contains(a.body, flowcontrol.ReasonQueueBytesExceeded) {
			t.Fatalf("want over1 answered 429 %s, got %+v", flowcontrol.ReasonQueueBytesExceeded, a)
		}
		// Pool 2 has a free slot: pool 0's backlog does not hold it.
		free := fx.send(t, 2, "free2", ch)
		if a := await(t, ch); a.name != "free2" || a.dest == "" {
			t.Fatalf("want free2 forwarded at once, got %+v", a)
		}
		free.finish(t)
		first0.finish(t)
		if a := await(t, ch); a.name != "queued0" {
			t.Fatalf("want queued0 released, got %+v", a)
		}
		if got := fx.fc.QueuedBytes(); got != 0 {
			t.Fatalf("queued bytes %d after the release, want 0", got)
		}
		first1.finish(t)
	})

	t.Run("client gone", func(t *testing.T) {
		fx := newFlowFixture(t, 1, flowcontrol.Options{})
		ch := make(chan answer, 4)
		first := fx.send(t, 0, "first", ch)
		await(t, ch)
		gone := fx.send(t, 0, "gone", ch)
		next := fx.send(t, 0, "next", ch)
		fx.queued(t, 0, 2)
		gone.g.cancel()
		if a := <-ch; a.name != "gone" || a.err == nil {
			t.Fatalf("want the cancelled stream to end, got %+v", a)
		}
		fx.queued(t, 0, 1)
		if got := fx.fc.QueuedBytes(); got != body {
			t.Fatalf("queued bytes %d, want %d (the gone request's released)", got, body)
		}
		first.finish(t)
		if a := await(t, ch); a.name != "next" || a.dest == "" {
			t.Fatalf("want next released, got %+v", a)
		}
		next.finish(t)
	})
}

// TestFlowControlWaitingRoom: a request to a pool without endpoints waits
// for one instead of a 503, is routed to it the moment it is published, and
// is answered 503 naming the reason when none comes within the TTL.
func TestFlowControlWaitingRoom(t *testing.T) {
	fx := newFlowFixture(t, 2, flowcontrol.Options{NoEndpointTTL: 10 * time.Second})
	empty := fx.f.pools[1]
	empty.SetPods(nil)
	ch := make(chan answer, 2)
	r := fx.send(t, 1, "waiting", ch)
	poll.Until(t, 10*time.Second, "a request in pool 1's waiting room", func() bool {
		return fx.gauge("inference_extension_flow_control_waiting_room_requests", 1) == 1
	})
	fx.expectNone(t, ch, 1)
	empty.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: poolNS(1), Name: "new"}, UID: "uid-new", IP: "127.0.2.9"}})
	if a := await(t, ch); a.dest != "127.0.2.9:8000" {
		t.Fatalf("want the new endpoint, got %+v", a)
	}
	r.finish(t)
	if got := fx.gauge("inference_extension_flow_control_waiting_room_requests", 1); got != 0 {
		t.Fatalf("waiting room gauge %v after the release", got)
	}

	t.Run("TTL", func(t *testing.T) {
		fx := newFlowFixture(t, 1, flowcontrol.Options{NoEndpointTTL: 100 * time.Millisecond})
		fx.f.pools[0].SetPods(nil)
		ch := make(chan answer, 1)
		fx.send(t, 0, "expires", ch)
		if a := await(t, ch); a.code != 503 || !strings.Contains(a.body, flowcontrol.ReasonNoEndpointsTimeout) {
			t.Fatalf("want 503 %s, got %+v", flowcontrol.ReasonNoEndpointsTimeout, a)
		}
	})
}

// TestFlowControlPoolRemoved: requests queued for a pool that goes away are
// answered 503 at once, and the pool's series go with it.
func TestFlowControlPoolRemoved(t *testing.T) {
	fx := newFlowFixture(t, 1, flowcontrol.Options{})
	ch := make(chan answer, 3)
	first := fx.send(t, 0, "first", ch)
	await(t, ch)
	fx.send(t, 0, "queued", ch)
	fx.queued(t, 0, 1)
	fx.f.reg.Remove(fx.f.pools[0].Key)
	if a := await(t, ch); a.name != "queued" || a.code != 503 || !strings.Contains(a.body, flowcontrol.ReasonPoolRemoved) {
		t.Fatalf("want queued answered 503 %s, got %+v", flowcontrol.ReasonPoolRemoved, a)
	}
	if got := fx.fc.QueuedBytes(); got != 0 {
		t.Fatalf("queued bytes %d after the pool went, want 0", got)
	}
	if got := fx.gauge("inference_extension_flow_control_queue_size", 0); got != 0 {
		t.Fatalf("queue size series of a removed pool: %v", got)
	}
	first.finish(t)
}

// The flow header keys a flow-control queue: an invalid value is refused
// like every header read, before it is queued.
func TestInvalidFlowHeader(t *testing.T) {
	fx := newFlowFixture(t, 1, flowcontrol.Options{FlowHeader: "X-Tenant"})
	for what, bad := range badValues {
		t.Run(what, func(t *testing.T) {
			g := fx.ts.open(t, authorityOf(0), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{"x-tenant", bad, true}), false), duplex, duplex))
			_ = g.stream.Send(reqBody(completionBody("m", 1), true))
			code, body := immediateCode(t, g.recv())
			if msg := errorBodyOf(t, body).Error.Message; code != 400 || !strings.Contains(msg, "request header x-tenant ") {
				t.Fatalf("status %d %s, want 400 naming x-tenant", code, body)
			}
		})
	}
	routeOnce(t, fx.ts, fx.f, 0)
}

// TestQueuedRequestHeldByTheQueue: a request waiting in flow control's
// queue is counted against the queue's bytes, not the held-body budget,
// so one pool's backlog does not spend the budget every pool's bodies
// share.
func TestQueuedRequestHeldByTheQueue(t *testing.T) {
	fx := newFlowFixture(t, 1, flowcontrol.Options{})
	ch := make(chan answer, 2)
	first := fx.send(t, 0, "first", ch)
	await(t, ch)
	fx.send(t, 0, "queued", ch)
	fx.queued(t, 0, 1)
	if held := fx.ts.srv.limits.held.Total(); held != 0 {
		t.Fatalf("%d bytes charged to the held-body budget while the request waits in the queue, want 0", held)
	}
	if q, want := fx.fc.QueuedBytes(), int64(len(completionBody("m", 10))); q != want {
		t.Fatalf("queued bytes %d, want the body's %d", q, want)
	}
	first.finish(t)
	if a := await(t, ch); a.name != "queued" || a.code != 0 {
		t.Fatalf("queued request after the first finished: %+v", a)
	}
}
