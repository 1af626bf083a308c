package main

import (
	"bytes"
	"context"
	"testing"
)

// quickSweep is the sweep's quick mode, run by `make test` (under -race):
// two points where routing decides the outcome, short runs, and the
// baselines the targets name. The routers run one after the other and the
// servers only twice as fast as simulated, so that a busy two-core machine
// keeps up under the race detector.
func quickSweep() sweepConfig {
	c := defaultSweep()
	c.requests, c.timeScale, c.parallel = 240, 2, false
	c.groups, c.loads = []int{6, 12}, []float64{0.5}
	c.routers = []router{allRouters[0], allRouters[1], allRouters[3]} // poolpicker, round-robin, upstream-weights
	return c
}

// TestQuickSweep checks the targets that hold with a wide margin on every
// run (measured over repeated runs on a shared two-core machine): at each
// point poolpicker's hit rate is within 0.03 of the reference weights' and
// above round-robin's, and its median time to first token is below
// round-robin's. Finer comparisons are read from the full sweep.
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
			pp, rr, up := byName["poolpicker"], byName["round-robin"], byName["upstream-weights"]
			if pp.hitRate < up.hitRate-0.03 || pp.hitRate <= rr.hitRate {
				t.Errorf("G=%d load=%.0f%%: poolpicker hit rate %.3f; upstream weights %.3f, round-robin %.3f", g, load*100, pp.hitRate, up.hitRate, rr.hitRate)
			}
			if pp.ttft50 >= rr.ttft50 {
				t.Errorf("G=%d load=%.0f%%: poolpicker TTFT p50 %v, round-robin %v", g, load*100, pp.ttft50, rr.ttft50)
			}
		}
	}
}
