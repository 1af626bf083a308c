// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"sync"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// keepBusy notes requests for each pool at its rate (requests per 10 ms)
// until the test ends.
func keepBusy(t *testing.T, rates map[*datastore.Pool]int) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				for p, n := range rates {
					for range n {
						p.NoteRequest(now)
					}
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// Scrapes spend no more CPU than the budget pays for, however many are
// due; the wait and the slowed pools show on the budget's metrics.
func TestBudgetBoundsScrapeCPU(t *testing.T) {
	const cores = 0.05
	servers := startModelServers(t, 8)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	}
	// Eight servers at 1 ms want 8,000 scrapes a second: far more than
	// 5 % of a core pays for, however loaded the machine.
	// No per-server bound (MaxServerCPUShare): under the race detector on a
	// loaded machine a page's measured CPU can slow each server on its own
	// and starve the first scrapes; the budget alone is under test here.
	h := newHarness(t, Options{RefreshInterval: time.Millisecond, CPUBudget: cores, MaxServerCPUShare: -1})
	p := h.addPool("pool", nil, servers[0].port, servers...)
	keepBusy(t, map[*datastore.Pool]int{p: 1})
	h.awaitScrapes(t, servers[0].addr, 2)
	used0, t0 := h.m.budget.used.Load(), time.Now()
	// Until two plans have run and the pool is slowed. Not a count of
	// scrapes: on a loaded machine the budget pays for few of them.
	h.await(t, "the pool slowed", func(scrapeEvent) bool { return h.single(t, "poolpicker_scrape_budget_slowed_pools") == 1 })
	used, elapsed := time.Duration(h.m.budget.used.Load()-used0), time.Since(t0)
	// The bucket holds a tenth of a second's worth, and a scrape admitted
	// on an estimate may overspend it once.
	allowed := time.Duration(cores*float64(elapsed)) + time.Duration(cores*float64(100*time.Millisecond)) + 4*h.m.budget.expected()
	t.Logf("scrapes spent %v of CPU in %v (%.3f cores), %v a scrape", used, elapsed, used.Seconds()/elapsed.Seconds(), h.m.budget.expected())
	if used > allowed {
		t.Errorf("scrapes spent %v of CPU in %v, want at most %v at %.2f cores", used, elapsed, allowed, cores)
	}
	// Eight servers sharing 5 % of a core at ~100 µs a scrape get far
	// less than every 1 ms.
	if got := h.single(t, "poolpicker_scrape_budget_busy_interval_max_seconds"); got <= time.Millisecond.Seconds() {
		t.Errorf("longest busy interval %v s with the pool slowed, want above the refresh interval", got)
	}
	if got := h.single(t, "poolpicker_scrape_budget_cores"); got != cores {
		t.Errorf("budget gauge %v, want %v", got, cores)
	}
	if got := h.single(t, "poolpicker_scrape_budget_wait_seconds_total"); got <= 0 {
		t.Errorf("no wait for the budget counted: %v", got)
	}
	if got := h.single(t, "poolpicker_scrape_budget_used_cpu_seconds_total"); got <= 0 {
		t.Errorf("no scrape CPU counted: %v", got)
	}
}

// When the budget cannot pay for every busy server at RefreshInterval, the
// busy pools share it by request rate: the pool with ten times the other's
// requests gets several times its scrapes.
func TestBudgetSharedByRequestRate(t *testing.T) {
	servers := startModelServers(t, 8)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: time.Millisecond, CPUBudget: 0.05, MaxServerCPUShare: -1})
	hot := h.addPool("hot", nil, servers[0].port, servers[:4]...)
	warm := h.addPool("warm", nil, servers[0].port, servers[4:]...)
	keepBusy(t, map[*datastore.Pool]int{hot: 10, warm: 1})
	// Two plans (a second each) set the shares; then count.
	h.await(t, "both pools slowed", func(scrapeEvent) bool { return h.single(t, "poolpicker_scrape_budget_slowed_pools") >= 1 })
	h.m.mu.Lock()
	planned := h.m.nextPlan
	h.m.mu.Unlock()
	h.await(t, "a plan later", func(scrapeEvent) bool { return time.Now().After(planned) })
	counts := map[datastore.PoolKey]int{}
	h.await(t, "200 scrapes of the hot pool", func(ev scrapeEvent) bool {
		counts[ev.pool]++
		return counts[hot.Key] >= 200
	})
	t.Logf("scrapes hot %d, warm %d", counts[hot.Key], counts[warm.Key])
	if ratio := float64(counts[hot.Key]) / float64(max(counts[warm.Key], 1)); ratio < 3 {
		t.Errorf("scrapes hot %d, warm %d (ratio %.1f): want the pool with ten times the requests to get at least three times the scrapes", counts[hot.Key], counts[warm.Key], ratio)
	}
}

// single returns the value of a family with one unlabelled sample.
func (h *harness) single(t *testing.T, family string) float64 {
	t.Helper()
	fams, err := h.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == family && len(f.Metric) == 1 {
			return value(f.Metric[0])
		}
	}
	t.Fatalf("no %s", family)
	return 0
}

// A busy pool the budget slowed to seconds between scrapes is scraped
// again at the refresh interval as soon as a plan restores it, not when
// its servers' late due times come.
func TestBudgetRestoredPoolHastened(t *testing.T) {
	servers := startModelServers(t, 17)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	}
	// A scrape's cost on this machine, measured without a budget.
	const refresh = 20 * time.Millisecond
	cal := newHarness(t, Options{RefreshInterval: refresh, CPUBudget: -1})
	cal.addPool("calibration", nil, servers[0].port, servers...)
	for range 4 {
		cal.awaitScrapes(t, servers[16].addr, 10)
	}
	cost := cal.m.budget.expected()
	// Sixteen servers at 20 ms want 800 scrapes a second, one server 50:
	// the budget pays for three times the one's, a fifth of all of them.
	cores := 3 * float64(time.Second/refresh) * cost.Seconds()
	t.Logf("%v a scrape: a budget of %.3f cores", cost, cores)
	// An idle interval of its own, so that the pools' first requests turn
	// their servers busy at once (PoolDemanded): without one a server only
	// turns busy when a scrape ends, and the quiet pool's, scraped once
	// before its first request, would wait behind the loud pool's busy
	// servers, which the budget cannot all pay for, and never be planned.
	h := newHarness(t, Options{RefreshInterval: refresh, IdleRefreshInterval: time.Minute, CPUBudget: cores, DemandWindow: 300 * time.Millisecond})
	loud := h.addPool("loud", nil, servers[0].port, servers[:16]...)
	quiet := h.addPool("quiet", nil, servers[0].port, servers[16])
	stopLoud, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		loudOn := true
		for {
			select {
			case <-stop:
				return
			case <-stopLoud:
				loudOn, stopLoud = false, nil
			case now := <-tick.C:
				// The loud pool's weight is a thousand times the quiet one's.
				for i := 0; loudOn && i < 1000; i++ {
					loud.NoteRequest(now)
				}
				quiet.NoteRequest(now)
			}
		}
	}()
	quietServer := func() (interval, ahead time.Duration, running bool) {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		ps := h.m.pools[quiet.Key]
		s := ps.subs[endpointOf(t, quiet, servers[16].addr).Key()].srv
		return ps.interval, s.next.Sub(s.lastStart), s.running
	}
	h.await(t, "the quiet pool slowed to a second or more, its server due that late", func(scrapeEvent) bool {
		interval, ahead, running := quietServer()
		return interval >= time.Second && ahead >= time.Second && !running
	})
	t.Logf("slowed: %v a scrape, %.0f scrapes a second", h.m.budget.expected(), h.m.budget.rate())
	close(stopLoud)
	h.await(t, "a plan restoring the quiet pool", func(scrapeEvent) bool {
		interval, _, _ := quietServer()
		return interval == 0
	})
	// Due at most its new interval after its last start, or, when that
	// time has passed, as soon as its scrape ended: within a few intervals
	// however long a loaded machine made that scrape, and far from the
	// second or more it was slowed to.
	if _, ahead, running := quietServer(); !running && ahead > 10*refresh {
		t.Errorf("the restored pool's server is due %v after its last scrape, want within %v", ahead, 10*refresh)
	}
}

// One timed scrape that read what its thread ran while it was preempted
// moves the mean cost by a bounded step, not by its own size.
func TestBudgetSampleBounded(t *testing.T) {
	b := newBudget(1)
	for range 64 {
		b.charge(30*time.Microsecond, b.take(), true)
	}
	before := b.expected()
	b.charge(20*time.Millisecond, b.take(), true)
	after := b.expected()
	if limit := before + (maxSampleFactor-1)*before/16 + time.Microsecond; after > limit {
		t.Errorf("one 20 ms sample moved the mean from %v to %v, want at most %v", before, after, limit)
	}
	// A sustained rise still reaches the mean.
	for range 64 {
		b.charge(300*time.Microsecond, b.take(), true)
	}
	if got := b.expected(); got < 250*time.Microsecond {
		t.Errorf("after 64 samples of 300 µs the mean is %v, want it near 300 µs", got)
	}
}
