// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// load is an endpoint's scrape in a test: its waiting requests and KV-cache
// use; stale marks a scrape too old to count (the load unknown).
type load struct {
	waiting int
	kvCache float64
	stale   bool
}

func (l load) metrics() *datastore.Metrics {
	m := &datastore.Metrics{WaitingRequests: l.waiting, KVCacheUsage: l.kvCache, ScrapedAt: time.Now()}
	if l.stale {
		m.ScrapedAt = time.Now().Add(-time.Minute)
	}
	return m
}

// TestPickShedsSheddable: a request of negative priority that flow control
// did not admit is refused with a 429 Shed, before it is scheduled, when
// its pool is saturated by the scheduler's admission rule: under
// all-saturated when every endpoint is saturated (5 waiting requests or
// 80% KV cache) or unknown; under pool-average when the endpoints' mean
// load (the larger of queue over 5 and KV cache over 0.8, unknown counting
// 1) is at least 1, though some endpoint has room. A request of priority
// >= 0 is never refused, nor one flow control admitted.
func TestPickShedsSheddable(t *testing.T) {
	const (
		all = scheduling.AdmissionAllSaturated
		avg = scheduling.AdmissionPoolAverage
	)
	for _, tc := range []struct {
		name  string
		loads []load
		// wantShed says, by rule, whether the sheddable request is shed;
		// wantMean is the mean load the pool-average refusal reports.
		wantShed map[string]bool
		wantMean string
	}{
		{name: "idle", loads: []load{{}, {}},
			wantShed: map[string]bool{all: false, avg: false}},
		{name: "mean below 1, one saturated", loads: []load{{6, 0.1, false}, {1, 0.1, false}},
			wantShed: map[string]bool{all: false, avg: false}},
		{name: "mean 1 by queues, one with room", loads: []load{{8, 0.1, false}, {2, 0.1, false}},
			wantShed: map[string]bool{all: false, avg: true}, wantMean: "1.00"},
		{name: "mean over 1 by KV cache, one with room", loads: []load{{0, 1, false}, {0, 0.7, false}},
			wantShed: map[string]bool{all: false, avg: true}, wantMean: "1.06"},
		{name: "unknown counts 1, other half loaded", loads: []load{{stale: true}, {0, 0.4, false}},
			wantShed: map[string]bool{all: false, avg: false}},
		{name: "unknown counts 1, other full", loads: []load{{stale: true}, {0, 0.8, false}},
			wantShed: map[string]bool{all: true, avg: true}, wantMean: "1.00"},
		{name: "every endpoint saturated or unknown", loads: []load{{5, 0.1, false}, {0, 0.85, false}, {stale: true}},
			wantShed: map[string]bool{all: true, avg: true}, wantMean: "1.02"},
		{name: "one endpoint with room of three", loads: []load{{4, 0.79, false}, {0, 0.85, false}, {stale: true}},
			wantShed: map[string]bool{all: false, avg: true}, wantMean: "1.02"},
	} {
		for _, rule := range []string{all, avg} {
			t.Run(tc.name+"/"+rule, func(t *testing.T) {
				sched, err := scheduling.New(nil, scheduling.Options{SaturationAdmission: rule})
				if err != nil {
					t.Fatal(err)
				}
				c, err := New(sched, Options{})
				if err != nil {
					t.Fatal(err)
				}
				p := pool(t, len(tc.loads))
				p.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1, "chat": 0, "high": 2}})
				for i, e := range p.Endpoints().Endpoints {
					e.SetMetrics(tc.loads[i].metrics())
				}
				r := c.Request()
				r.Pool, r.ID, r.Objective = p, "batch-1", "batch"
				d, err := r.Pick(context.Background(), noWait{})
				r.Sent()
				if !tc.wantShed[rule] {
					if err != nil {
						t.Fatalf("sheddable request refused: %v", err)
					}
					if d.Result.Priority != -1 {
						t.Fatalf("priority %d, want -1", d.Result.Priority)
					}
				} else {
					why := "every endpoint has at least 5 waiting requests, KV cache at least 80% used, or no fresh metrics"
					if rule == avg {
						why = "its endpoints' mean load, of 5 waiting requests or 80% KV cache each, is " + tc.wantMean
					}
					want := &Refusal{Code: http.StatusTooManyRequests, Reason: "Shed",
						Message: fmt.Sprintf(`pool ns/pool is saturated (%s); request of objective "batch" (priority -1) is sheddable`, why)}
					var rf *Refusal
					if !errors.As(err, &rf) || *rf != *want {
						t.Fatalf("Pick: %v, want %v", err, want)
					}
					if !d.Scheduled || d.Result != nil {
						t.Fatalf("decision %+v, want scheduled (the refusal timed as scheduling) without a result", d)
					}
					if sched.RecentDecisions(p) != nil {
						t.Fatal("a shed request reached the scheduler's picks")
					}
				}
				for objective, priority := range map[string]int{"chat": 0, "high": 2, "": 0, "not-an-objective": 0} {
					r := c.Request()
					r.Pool, r.ID, r.Objective = p, "req-"+objective, objective
					d, err := r.Pick(context.Background(), noWait{})
					r.Sent()
					if err != nil {
						t.Fatalf("request of objective %q refused: %v", objective, err)
					}
					if d.Result.Priority != priority {
						t.Fatalf("objective %q: priority %d, want %d", objective, d.Result.Priority, priority)
					}
				}
			})
		}
	}
}

// TestPickAdmittedIsNotShed: a sheddable request that flow control
// released, because an endpoint has a free slot as flow control counts it,
// is scheduled though the scrapes say the pool is saturated on average.
func TestPickAdmittedIsNotShed(t *testing.T) {
	sched, err := scheduling.New(nil, scheduling.Options{SaturationAdmission: scheduling.AdmissionPoolAverage})
	if err != nil {
		t.Fatal(err)
	}
	fc, err := flowcontrol.New(flowcontrol.Options{EndpointSaturated: sched.EndpointSaturated})
	if err != nil {
		t.Fatal(err)
	}
	p := pool(t, 2)
	p.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1}})
	for i, e := range p.Endpoints().Endpoints {
		e.SetMetrics([]load{{8, 0.1, false}, {2, 0.1, false}}[i].metrics())
	}
	if saturated, _ := sched.AdmissionSaturated(p); !saturated {
		t.Fatal("the pool is not saturated on average; the test proves nothing")
	}
	c, err := New(sched, Options{FlowControl: fc})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Request()
	r.Pool, r.ID, r.Objective = p, "batch-1", "batch"
	d, err := r.Pick(context.Background(), noWait{})
	if err != nil {
		t.Fatalf("admitted request refused: %v", err)
	}
	r.Commit()
	r.Sent()
	r.Finish()
	if d.Result.Endpoints[0] != p.Endpoints().Endpoints[1] {
		t.Fatalf("picked %s, want the endpoint with room", d.Result.Endpoints[0].Address)
	}
}

// TestPickRewritesModel: the pool's rewrite rule for the model asked
// (exact match) chooses its target by weight (equally when every weight is
// 0) before the request is scheduled: the decision names the target and
// the rewrite, and the scheduler picks for the target. A model without a
// rule is sent as asked.
func TestPickRewritesModel(t *testing.T) {
	const n = 4000
	for _, tc := range []struct {
		name    string
		targets []datastore.RewriteTarget
		asked   string
		// want is each target's share of n requests; within 5 standard
		// deviations of a binomial.
		want        map[string]float64
		wantRewrite string
	}{
		{name: "weighted", asked: "llama",
			targets: []datastore.RewriteTarget{{Model: "llama-v1", Weight: 70, Rewrite: "canary"}, {Model: "llama-v2", Weight: 30, Rewrite: "canary"}},
			want:    map[string]float64{"llama-v1": 0.7, "llama-v2": 0.3}, wantRewrite: "canary"},
		{name: "unweighted share equally", asked: "llama",
			targets: []datastore.RewriteTarget{{Model: "a", Rewrite: "split"}, {Model: "b", Rewrite: "split"}},
			want:    map[string]float64{"a": 0.5, "b": 0.5}, wantRewrite: "split"},
		{name: "a weight of 0 is never chosen beside weighted ones", asked: "llama",
			targets: []datastore.RewriteTarget{{Model: "never", Rewrite: "rw"}, {Model: "always", Weight: 1, Rewrite: "rw"}},
			want:    map[string]float64{"always": 1}, wantRewrite: "rw"},
		{name: "matching is exact", asked: "LLAMA",
			targets: []datastore.RewriteTarget{{Model: "llama-v1", Weight: 1, Rewrite: "canary"}},
			want:    map[string]float64{"LLAMA": 1}},
		{name: "no model, no rewrite", asked: "",
			targets: []datastore.RewriteTarget{{Model: "llama-v1", Weight: 1, Rewrite: "canary"}},
			want:    map[string]float64{"": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sched, err := scheduling.New(nil, scheduling.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rnd := rand.New(rand.NewPCG(42, 1))
			c, err := New(sched, Options{Rand: rnd.Uint64})
			if err != nil {
				t.Fatal(err)
			}
			p := pool(t, 2)
			p.SetPolicy(&datastore.Policy{Rewrites: map[string][]datastore.RewriteTarget{"llama": tc.targets}})
			counts := map[string]int{}
			for i := range n {
				r := c.Request()
				r.Pool, r.ID = p, fmt.Sprint("req-", i)
				r.SetBody(tc.asked, nil)
				d, err := r.Pick(context.Background(), noWait{})
				r.Sent()
				if err != nil {
					t.Fatal(err)
				}
				wantRewrite := tc.wantRewrite
				if d.Target == tc.asked {
					wantRewrite = ""
				}
				if d.ModelRewrite != wantRewrite {
					t.Fatalf("%q sent as %q by rewrite %q, want rewrite %q", tc.asked, d.Target, d.ModelRewrite, wantRewrite)
				}
				if got := sched.RecentDecisions(p)[0].TargetModel; got != d.Target {
					t.Fatalf("scheduled for model %q, sent as %q", got, d.Target)
				}
				counts[d.Target]++
			}
			for m, share := range tc.want {
				mean, sd := n*share, math.Sqrt(n*share*(1-share))
				if got := float64(counts[m]); math.Abs(got-mean) > 5*sd {
					t.Errorf("%q chosen %v of %d times, want %v ± %.0f", m, got, n, mean, 5*sd)
				}
				delete(counts, m)
			}
			if len(counts) > 0 {
				t.Errorf("targets not in the rule chosen: %v", counts)
			}
		})
	}
}
