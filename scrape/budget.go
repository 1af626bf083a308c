package scrape

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// budget admits scrapes at the rate a CPU budget allows, so that picks and
// stream handling keep the rest of the cores: a bucket of CPU time filled
// at Cores per second (up to a tenth of a second's worth), charged by each
// scrape with the CPU time it took. A scrape is admitted while the bucket
// is not empty, charged its expected cost then and the difference when it
// ends. Without a budget (Cores zero) it only measures.
type budget struct {
	cores float64 // zero: unlimited

	mu     sync.Mutex
	tokens time.Duration // CPU time the scrapes may still spend; negative: owed
	last   time.Time     // when tokens was last filled
	// perScrape is the average CPU time of a scrape (an exponentially
	// weighted mean over the last hundred or so).
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

// charge records a scrape's measured CPU time, admitted with the expected
// cost.
func (b *budget) charge(cost, expected time.Duration) {
	b.used.Add(int64(cost))
	if b.cores <= 0 {
		return
	}
	b.mu.Lock()
	b.tokens -= cost - expected
	b.perScrape += (cost - b.perScrape) / 64
	b.mu.Unlock()
}

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

// cpuClock adds up the CPU time a scrape spends on its goroutine: the
// spans of it that cannot block (a read or write system call, the parse,
// the publication), each read from the running thread's CPU clock. The
// goroutine is not locked to a thread: a locked goroutine that blocks on
// the network hands its processor to another thread and back, which cost
// more than the scrape's parse. A span whose goroutine was preempted and
// resumed on another thread reads two threads' clocks, so each span counts
// at most its wall time.
type cpuClock struct{ total time.Duration }

// span is a started measurement of cpuClock.
type span struct {
	cpu  time.Duration
	wall time.Time
}

func (c *cpuClock) begin() span { return span{cpu: threadCPU(), wall: time.Now()} }

func (c *cpuClock) end(sp span) {
	d := threadCPU() - sp.cpu
	c.total += min(max(d, 0), time.Since(sp.wall))
}

// take returns the time counted since the last take.
func (c *cpuClock) take() time.Duration {
	d := c.total
	c.total = 0
	return d
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
