// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package load

import (
	"fmt"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

func TestLoadScorers(t *testing.T) {
	type ep struct {
		m        *framework.Scrape // nil: never scraped
		inFlight int64
		held     int64 // held for it by flow control (Candidate.Held)
	}
	fresh := func(waiting, running int, kv float64) *framework.Scrape {
		return &framework.Scrape{WaitingRequests: waiting, RunningRequests: running, KVCacheUsage: kv, ScrapedAt: time.Now()}
	}
	// sized is a fresh scrape of a server of the given KV cache.
	sized := func(blocks int) *framework.Scrape {
		m := fresh(0, 0, 0)
		m.NumBlocks, m.BlockSize = blocks, 16
		return m
	}
	cases := []struct {
		name    string
		factory framework.Factory
		params  string
		eps     []ep
		want    []float64
	}{
		{"queue spread", NewQueue, "", []ep{{m: fresh(0, 0, 0)}, {m: fresh(5, 0, 0)}, {m: fresh(10, 0, 0)}}, []float64{1, 0.5, 0}},
		{"queue equal", NewQueue, "", []ep{{m: fresh(3, 0, 0)}, {m: fresh(3, 0, 0)}}, []float64{1, 1}},
		{"queue unknown scores 0 and is left out of the range", NewQueue, "", []ep{{m: nil}, {m: fresh(2, 0, 0)}, {m: fresh(4, 0, 0)}}, []float64{0, 1, 0}},
		{"queue all unknown", NewQueue, "", []ep{{}, {}}, []float64{0, 0}},
		{"running spread", NewRunningRequests, "", []ep{{m: fresh(0, 8, 0)}, {m: fresh(0, 2, 0)}, {m: fresh(9, 4, 0)}}, []float64{0, 1, 4.0 / 6}},
		{"kv absolute", NewKVCacheUtilization, "", []ep{{m: fresh(0, 0, 0.25)}, {m: fresh(0, 0, 1)}, {m: nil}}, []float64{0.75, 0, 0}},
		{"in-flight spread, known without metrics", NewInFlight, "", []ep{{m: nil, inFlight: 4}, {m: fresh(0, 0, 0), inFlight: 0}, {m: nil, inFlight: 2}}, []float64{0, 1, 0.5}},
		{"in-flight equal", NewInFlight, "", []ep{{inFlight: 1}, {inFlight: 1}}, []float64{1, 1}},
		{"in-flight counts held requests", NewInFlight, "", []ep{{inFlight: 1, held: 3}, {inFlight: 2}, {inFlight: 0}}, []float64{0, 0.5, 1}},
		{"queue counts held requests", NewQueue, "", []ep{{m: fresh(1, 0, 0), held: 4}, {m: fresh(3, 0, 0)}, {m: fresh(0, 0, 0)}}, []float64{0, 0.4, 1}},
		{"held requests of an unscraped endpoint leave its queue unknown", NewQueue, "", []ep{{m: nil, held: 4}, {m: fresh(2, 0, 0)}}, []float64{0, 1}},
		// Caches of 4, 2 and 1 parts with 4, 2 and 2 in flight: the first
		// two are as loaded, the third twice; per cache they are 1, 1, 2.
		{"in-flight per cache size", NewInFlight, "", []ep{{m: sized(400), inFlight: 4}, {m: sized(200), inFlight: 2}, {m: sized(100), inFlight: 2}}, []float64{1, 1, 0}},
		{"in-flight per cache size off", NewInFlight, `{"perCacheSize": false}`, []ep{{m: sized(400), inFlight: 4}, {m: sized(200), inFlight: 2}, {m: sized(100), inFlight: 2}}, []float64{0, 1, 1}},
		// An unknown size weighs the mean of the known (300): 3 in flight
		// there is as loaded as 4 on the cache of 400.
		{"in-flight per cache size, one unknown", NewInFlight, "", []ep{{m: sized(400), inFlight: 4}, {m: nil, inFlight: 3}, {m: sized(200), inFlight: 0}}, []float64{0, 0, 1}},
		{"in-flight equal caches are counts", NewInFlight, "", []ep{{m: sized(300), inFlight: 4}, {m: sized(300), inFlight: 2}, {m: sized(300), inFlight: 0}}, []float64{0, 0.5, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var eps []*frameworktest.Endpoint
			cands := make([]framework.Candidate, len(c.eps))
			for i, e := range c.eps {
				endpoint := frameworktest.NewEndpoint(fmt.Sprintf("127.0.1.%d:8000", i+1), nil)
				endpoint.SetInFlight(e.inFlight)
				eps = append(eps, endpoint)
				cands[i] = framework.Candidate{Endpoint: endpoint, Metrics: framework.MetricsOf(e.m), Index: i, Held: e.held}
			}
			cs := frameworktest.NewCycle(frameworktest.NewPool("ns", "pool", eps...), "m", 1)
			s := frameworktest.Build(t, c.factory, "test", c.params).(framework.Scorer)
			scores, st := frameworktest.Score(t, s, cs, &framework.Request{}, cands)
			if st != nil || !schedtest.ApproxEqual(scores, c.want) {
				t.Fatalf("scores %v, status %v; want %v and none", scores, st, c.want)
			}
		})
	}
}
