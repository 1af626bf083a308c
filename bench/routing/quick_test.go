package main

import (
	"bytes"
	"context"
	"testing"
)

// quickSweep is the sweep's quick mode, run by `make test` (under -race):
// the point where routing decides the outcome most (G = 12 at half load),
// a short run, against round-robin. The routers run at once
// and in real time, so that a busy machine (and the race detector's cost)
// falls on them alike and stretches simulated time as little as it can.
func quickSweep() sweepConfig {
	c := defaultSweep()
	c.requests, c.timeScale, c.parallel = 200, 1, true
	c.groups, c.loads = []int{12}, []float64{0.5}
	c.routers = allRouters[:2] // poolpicker, round-robin
	return c
}

// TestQuickSweep runs the harness end to end and checks the one target that
// held on every run under the race detector on a shared two-core machine:
// poolpicker's hit rate is far above round-robin's (0.87 against 0.42 in a
// run so starved that every router's TTFT p50 was 26-31 s). Latency and
// the comparison with the reference weights moved by more than their
// targets between such runs (poolpicker's hit rate 0.65-0.87 against
// 0.75-0.77), so they are read from the full sweep, not asserted here.
func TestQuickSweep(t *testing.T) {
	c := quickSweep()
	for _, g := range c.groups {
		for _, load := range c.loads {
			rs, err := runPoint(context.Background(), &c, g, load)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			printResults(&out, rs, true)
			t.Logf("G=%d load=%.0f%%:\n%s", g, load*100, out.String())
			byName := map[string]result{}
			for _, r := range rs {
				if r.failed > 0 || r.served == 0 {
					t.Fatalf("%s: %d failed, %d served: %s", r.router, r.failed, r.served, r.firstFailure)
				}
				byName[r.router] = r
			}
			pp, rr := byName["poolpicker"], byName["round-robin"]
			if pp.hitRate < rr.hitRate+0.2 {
				t.Errorf("G=%d load=%.0f%%: poolpicker hit rate %.3f, round-robin %.3f", g, load*100, pp.hitRate, rr.hitRate)
			}
		}
	}
}
