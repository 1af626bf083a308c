// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// budget admits scrapes at the rate a CPU budget allows, so that picks and
// stream handling keep the rest of the cores: a bucket of CPU time filled
// at Cores per second (up to a tenth of a second's worth), charged by each
// scrape with the CPU time it took. A scrape is admitted while the bucket
// is not empty and charged the mean cost then; a timed one (every
// poller's scrape, and one https scrape in timedEvery) is charged the
// difference when it ends and moves the mean.
// Without a budget (Cores zero) it only measures.
type budget struct {
	cores float64 // zero: unlimited

	mu     sync.Mutex
	tokens time.Duration // CPU time the scrapes may still spend; negative: owed
	last   time.Time     // when tokens was last filled
	// perScrape is the average CPU time of a scrape (an exponentially
	// weighted mean over the last sixteen or so timed ones).
	perScrape time.Duration

	used   atomic.Int64 // CPU nanoseconds scrapes spent
	waited atomic.Int64 // nanoseconds due scrapes waited for the budget
}

// initialPerScrape is the expected cost before any scrape was measured.
const initialPerScrape = 100 * time.Microsecond

func newBudget(cores float64) *budget {
	return &budget{cores: cores, perScrape: initialPerScrape}
}

// wait returns zero when the budget admits a scrape now, else how long
// until it does.
func (b *budget) wait(now time.Time) time.Duration {
	if b.cores <= 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	burst := time.Duration(b.cores * float64(100*time.Millisecond))
	if b.last.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(b.tokens+time.Duration(b.cores*float64(now.Sub(b.last))), burst)
	}
	b.last = now
	if b.tokens < 0 {
		return time.Duration(float64(-b.tokens)/b.cores) + 1
	}
	return 0
}

// take charges an admitted scrape its expected cost, and returns it.
func (b *budget) take() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens -= b.perScrape
	return b.perScrape
}

// charge records the CPU time of a scrape admitted with the expected
// cost: measured, or, for a scrape that was not timed (timedEvery), the
// expected cost itself.
func (b *budget) charge(cost, expected time.Duration, measured bool) {
	if !measured {
		cost = expected
		b.used.Add(int64(cost))
		return
	}
	b.mu.Lock()
	// A span preempted midway reads what its thread ran meanwhile (another
	// goroutine, the garbage collector's marking) up to its wall time:
	// tens of milliseconds against a scrape's tens of microseconds. Taken
	// whole, one such sample would multiply the mean, and the budget would
	// slow every busy pool for a plan or more; bounded, a sample moves the
	// mean by at most a few sixteenths, and a true rise in cost still
	// reaches it within a few dozen timed scrapes.
	cost = min(cost, maxSampleFactor*b.perScrape)
	b.tokens -= cost - expected
	b.perScrape += (cost - b.perScrape) / 16
	b.mu.Unlock()
	b.used.Add(int64(cost))
}

// maxSampleFactor bounds one timed scrape's cost against the mean.
const maxSampleFactor = 4

// expected is the cost a scrape is admitted with.
func (b *budget) expected() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.perScrape
}

// rate is the scrapes per second the budget pays for; zero when unlimited.
func (b *budget) rate() float64 {
	if b.cores <= 0 {
		return 0
	}
	return b.cores / b.expected().Seconds()
}

// timedEvery is how many https scrapes there are to one whose CPU time is
// measured: reading a thread's CPU clock is a system call, a few of them a
// scrape would cost a tenth of the scrape, and the budget needs the mean.
const timedEvery = 8

// cpuClock adds up the CPU time a scrape spends on its goroutine: the
// spans of it that cannot block (a read or write system call, the parse),
// each read from the running thread's CPU clock. The
// goroutine is not locked to a thread: a locked goroutine that blocks on
// the network hands its processor to another thread and back, which cost
// more than the scrape's parse. A span whose goroutine was preempted and
// resumed on another thread reads two threads' clocks, so each span counts
// at most its wall time.
type cpuClock struct {
	on    bool // this scrape is timed
	total time.Duration
}

// span is a started measurement of cpuClock.
type span struct {
	cpu  time.Duration
	wall time.Time
}

// start begins a scrape, timed or not.
func (c *cpuClock) start(timed bool) { c.on, c.total = timed, 0 }

func (c *cpuClock) begin() span {
	if !c.on {
		return span{}
	}
	return span{cpu: threadCPU(), wall: time.Now()}
}

func (c *cpuClock) end(sp span) {
	if !c.on {
		return
	}
	d := threadCPU() - sp.cpu
	c.total += min(max(d, 0), time.Since(sp.wall))
}

// threadCPU reads the running thread's CPU clock (fetch.ThreadCPU).
func threadCPU() time.Duration { return fetch.ThreadCPU() }
