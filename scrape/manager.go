// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"container/heap"
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// Manager keeps the metrics of every endpoint of every pool it hears of
// fresh. One dispatcher goroutine takes the model servers from a queue
// ordered by due time and scrapes them, at most MaxConcurrentScrapes at once:
// on a poller (one goroutine per whole core of the budget, each with many
// scrapes in flight), or, for https, on a goroutine that lives for that
// scrape only. Endpoints of several
// pools that resolve to the same metrics URL and engine are one server,
// scraped once per interval, the result published to each.
//
// It is a datastore.Observer: register it with Registry.AddObserver before
// pools exist, then run Start. Endpoints that appear before Start are
// scraped from Start on.
type Manager struct {
	opts      Options
	log       logr.Logger
	transport *http.Transport
	client    *http.Client
	stats     *statsCollector
	// parsers hold each engine's parsers: one per scrape in flight, not
	// per server.
	parsers map[Engine]*sync.Pool

	scrapes atomic.Uint64
	errors  atomic.Uint64
	// started counts the scrapes begun: one in timedEvery is timed.
	started atomic.Uint64
	// kept counts the http servers' kept connections.
	kept atomic.Int64
	// onScrape, when set before Start, hears of every finished scrape of
	// every pool's endpoint (tests).
	onScrape func(pool datastore.PoolKey, address string, err error)

	// slots bounds the scrapes in flight; inflight counts them. share
	// divides them fairly between namespaces and pools (a server several
	// pools hold is charged to each); starved are the pools with servers
	// waiting aside and none in flight, which a slot freed anywhere may
	// serve.
	slots    chan struct{}
	share    *fairshare.Limit
	starved  []*poolSubs
	inflight sync.WaitGroup
	// pollers run the scrapes of pollable servers (Start's); polling
	// counts their goroutines; nextPoller is the poller of the next new
	// server.
	pollers    []fetch.Fetcher
	npollers   int
	polling    sync.WaitGroup
	nextPoller int
	// wake tells the dispatcher the head of the queue changed.
	wake chan struct{}
	// budget admits the scrapes at the rate Options.CPUBudget pays for;
	// cpuSlots bounds the scrapes running at once (not waiting for the
	// network) to its whole cores (nil: no budget).
	budget   *budget
	cpuSlots chan struct{}

	// demandMu guards demanded, the pools PoolDemanded heard of that the
	// dispatcher has not handled yet: the request path appends to it and
	// never waits for mu. ended is set when the dispatcher has returned;
	// demandTimer wakes the dispatcher demandDelay after the first pool
	// noted.
	demandMu    sync.Mutex
	demanded    []*datastore.Pool
	ended       bool
	demandTimer *time.Timer

	mu sync.Mutex
	// ctx is Start's context; nil before Start.
	ctx     context.Context
	stopped bool
	pools   map[datastore.PoolKey]*poolSubs
	servers map[targetKey]*server
	// nextPlan is when the busy pools' shares of the budget are set again;
	// slowed counts the pools refreshed less often than RefreshInterval,
	// longest is the longest of their intervals.
	nextPlan time.Time
	slowed   int
	longest  time.Duration
	// budgetWait is when a due scrape began waiting for the budget.
	budgetWait time.Time
	// busy and idle are the servers waiting for their next scrape, by due
	// time: those of a pool with requests in the last DemandWindow, and the
	// others. A busy server due is scraped before an idle one.
	busy, idle serverQueue
	// parks counts the servers set aside for their pool's slots (tests).
	parks int
	// planned are the pools the next plan looks at: each that has had a
	// busy server or a parked one, or an interval of its own, since the
	// plan before. The others need nothing of it, and at ten thousand
	// pools a plan over all of them held mu, and a core, for 10-20 ms.
	planned map[*poolSubs]struct{}
}

type poolSubs struct {
	pool *datastore.Pool
	subs map[datastore.EndpointKey]*sub
	// slots is the pool's account of the scrapes in flight (Manager.share);
	// starved is set while it is in Manager.starved.
	slots   *fairshare.Party
	starved bool
	// inflight counts the pool's servers being scraped, at most
	// MaxConcurrentScrapesPerPool; parked are its servers due meanwhile.
	inflight int
	parked   []*server
	// interval is the time between scrapes of its busy servers that the
	// scrape budget allows, zero when RefreshInterval fits; requests are
	// the pool's request count when it was set.
	interval time.Duration
	requests uint64
}

var (
	_ datastore.Observer       = (*Manager)(nil)
	_ datastore.DemandObserver = (*Manager)(nil)
)

// NewManager returns a manager; its collectors are registered on
// opts.Registerer now.
func NewManager(opts Options) (*Manager, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	names, _ := resolveNames(opts.MetricNames) // validated
	opts.names = names
	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		// Pod IPs are never reached through a proxy.
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		MaxIdleConns:        opts.MaxIdleConns,
		MaxIdleConnsPerHost: opts.MaxIdleConnsPerHost,
		IdleConnTimeout:     opts.IdleConnTimeout,
		// Decompressing costs more CPU than the bytes cost on a cluster network.
		DisableCompression:    true,
		ResponseHeaderTimeout: opts.Timeout,
		TLSHandshakeTimeout:   opts.Timeout,
		TLSClientConfig:       &tls.Config{InsecureSkipVerify: !opts.VerifyServerCertificates}, // the operator's choice for self-signed servers
	}
	m := &Manager{
		opts:      opts,
		log:       opts.Logger,
		transport: transport,
		client: &http.Client{
			Transport: transport,
			// A metrics endpoint that redirects is misconfigured; following
			// it could send the picker anywhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		slots: make(chan struct{}, opts.MaxConcurrentScrapes),
		share: fairshare.New(fairshare.Options{Name: LimitInFlightScrapes, Flag: "metrics-max-concurrent-scrapes", Unit: "scrapes",
			Capacity: int64(opts.MaxConcurrentScrapes), ReservePercent: opts.FairShareReservePercent}),
		budget:  newBudget(opts.CPUBudget),
		wake:    make(chan struct{}, 1),
		pools:   map[datastore.PoolKey]*poolSubs{},
		planned: map[*poolSubs]struct{}{},
		servers: map[targetKey]*server{},
	}
	m.npollers = max(1, int(opts.CPUBudget))
	if opts.CPUBudget <= 0 {
		m.npollers = runtime.GOMAXPROCS(0)
	}
	m.demandTimer = time.AfterFunc(time.Hour, m.wakeDispatcher)
	m.demandTimer.Stop()
	if opts.CPUBudget > 0 {
		m.cpuSlots = make(chan struct{}, max(1, int(opts.CPUBudget)))
	}
	m.parsers = make(map[Engine]*sync.Pool, len(names))
	for e, n := range names {
		m.parsers[e] = &sync.Pool{New: func() any {
			p := NewParser(*n)
			p.fullParse = opts.DisableFastPath
			return p
		}}
	}
	m.stats = newStatsCollector(m)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(m.stats); err != nil {
			return nil, err
		}
		if err := opts.Registerer.Register(m.share); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Pollers is the number of poller goroutines Start runs, each on a thread
// of its own at a lower priority than the process's: one per whole core
// of the budget, at least one; without a budget, one per P.
func (m *Manager) Pollers() int { return m.npollers }

// StalenessThreshold is the effective staleness threshold.
func (m *Manager) StalenessThreshold() time.Duration { return m.opts.StalenessThreshold }

// Stats counts the requests to model servers and the failed ones since the
// manager was made, and the servers scraped now.
type Stats struct {
	Scrapes uint64
	Errors  uint64
	Servers int
}

// Stats returns the scrape counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	n := len(m.servers)
	m.mu.Unlock()
	return Stats{Scrapes: m.scrapes.Load(), Errors: m.errors.Load(), Servers: n}
}

// Start scrapes until ctx is done, then waits for the scrapes in flight
// and returns nil. It may be called once.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("scrape: manager already started")
	}
	m.ctx = ctx
	m.mu.Unlock()

	for range m.npollers {
		p, err := fetch.New(fetch.Options{
			MaxPageBytes: m.opts.MaxBodyBytes, Timeout: m.opts.Timeout, Kept: &m.kept,
			Parse: m.parsePolled, Complete: m.completePolled,
		})
		if err != nil {
			for _, p := range m.pollers {
				p.Stop()
			}
			m.polling.Wait()
			return err
		}
		m.pollers = append(m.pollers, p)
		m.polling.Go(p.Run)
	}

	m.dispatch(ctx)
	for _, p := range m.pollers {
		p.Stop()
	}

	m.demandMu.Lock()
	m.ended, m.demanded = true, nil
	m.demandTimer.Stop()
	m.demandMu.Unlock()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	// Every scrape's context is ctx's child, and the pollers end theirs:
	// they are ending.
	m.inflight.Wait()
	m.polling.Wait()
	m.mu.Lock()
	for _, s := range m.servers {
		m.dropConn(s)
	}
	m.mu.Unlock()
	m.transport.CloseIdleConnections()
	return nil
}

// dispatch starts the due scrapes, at most MaxConcurrentScrapes at once,
// until ctx is done.
func (m *Manager) dispatch(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case m.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		now := time.Now()
		demanded := m.takeDemanded()
		m.mu.Lock()
		for _, p := range demanded {
			m.demandLocked(p, now)
		}
		if !now.Before(m.nextPlan) {
			m.planLocked(now)
			m.nextPlan = now.Add(planInterval)
		}
		var s *server
		wait := m.dueLocked(now)
		if wait == 0 {
			// A scrape is due: the budget says when it may start.
			if wait = m.budget.wait(now); wait == 0 {
				s, wait = m.nextLocked(now)
			} else if m.budgetWait.IsZero() {
				m.budgetWait = now
			}
		}
		var interval time.Duration
		var due time.Time
		if s != nil {
			if !m.budgetWait.IsZero() {
				m.budget.waited.Add(int64(now.Sub(m.budgetWait)))
				m.budgetWait = time.Time{}
			}
			interval, due = s.interval, s.next
			s.running, s.lastStart = true, now
			if s.conn == nil {
				s.ctx, s.cancel = context.WithCancel(ctx)
			} else {
				s.conn.ClearCancel()
			}
			m.inflight.Add(1)
		}
		m.mu.Unlock()
		if s != nil {
			s.job = job{due: due, interval: interval, expected: m.budget.take()}
			if s.conn != nil {
				m.pollers[s.poller%len(m.pollers)].Submit(s.conn)
			} else {
				go m.scrape(s)
			}
			continue
		}
		<-m.slots
		if wait < 0 {
			timer.Stop()
		} else {
			// Scrapes due less than a quantum apart start together: at
			// ten thousand a second a wake-up per scrape was the
			// dispatcher's main cost, and a scrape's lateness is bounded
			// by the quantum, a fiftieth of the default interval.
			timer.Reset(max(wait, dispatchQuantum))
		}
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-timer.C:
		}
	}
}

// nextLocked takes the server to scrape now off its queue: the busy
// servers' queue first, then the idle servers', each by due time. A server
// whose pool has its share of the slots in flight waits aside until one of
// them ends. Without a server due, wait is the time until the next is
// (negative: none is queued).
func (m *Manager) nextLocked(now time.Time) (s *server, wait time.Duration) {
	for {
		q := &m.busy
		if len(m.busy) == 0 || m.busy[0].next.After(now) {
			q = &m.idle
		}
		if len(*q) == 0 || (*q)[0].next.After(now) {
			return nil, m.dueLocked(now)
		}
		s = heap.Pop(q).(*server)
		if full := m.fullPoolLocked(s); full != nil {
			s.parkedOn = full
			full.parked = append(full.parked, s)
			m.planLaterLocked(full)
			m.parks++
			// s may have been queued again for a slot of another of its
			// pools (unparkLocked): that slot goes to the next server
			// waiting for it, or a pool with nothing in flight would keep
			// its waiting servers parked for good.
			m.passOnLocked(s, full)
			continue
		}
		for _, ps := range s.counted {
			ps.inflight++
		}
		return s, 0
	}
}

// dueLocked is the time until the next server is due, zero when one is,
// negative when none is queued.
func (m *Manager) dueLocked(now time.Time) time.Duration {
	wait := time.Duration(-1)
	for _, q := range []serverQueue{m.busy, m.idle} {
		if len(q) > 0 && (wait < 0 || q[0].next.Sub(now) < wait) {
			wait = max(q[0].next.Sub(now), 0)
		}
	}
	return wait
}

// fullPoolLocked returns a pool of s that has its share of the slots in
// flight (MaxConcurrentScrapesPerPool, or its fair share of
// MaxConcurrentScrapes, which others hold the rest of), after charging a
// slot to each of s's pools and noting them in s.counted; when one is
// full nothing is charged.
func (m *Manager) fullPoolLocked(s *server) *poolSubs {
	s.counted = s.counted[:0]
	for sb := range s.subs {
		ps := m.pools[sb.pool.Key]
		if ps == nil || ps.pool != sb.pool || slices.Contains(s.counted, ps) {
			continue
		}
		if ps.inflight >= m.opts.MaxConcurrentScrapesPerPool || ps.slots.Acquire(1) != nil {
			for _, c := range s.counted {
				c.slots.Release(1)
			}
			s.counted = s.counted[:0]
			if ps.inflight == 0 && !ps.starved {
				ps.starved = true
				m.starved = append(m.starved, ps)
			}
			return ps
		}
		s.counted = append(s.counted, ps)
	}
	return nil
}

// passOnLocked queues again, for each pool of s other than full that has
// a slot free, one of the servers waiting for it.
func (m *Manager) passOnLocked(s *server, full *poolSubs) {
	for sb := range s.subs {
		ps := m.pools[sb.pool.Key]
		if ps == nil || ps.pool != sb.pool || ps == full || ps.inflight >= m.opts.MaxConcurrentScrapesPerPool {
			continue
		}
		m.unparkLocked(ps, 1)
	}
}

// releaseLocked gives back the pool slots of s's ended scrape; the
// server that has waited longest for each is queued again.
func (m *Manager) releaseLocked(s *server) {
	for _, ps := range s.counted {
		ps.inflight--
		ps.slots.Release(1)
		m.unparkLocked(ps, 1)
	}
	s.counted = s.counted[:0]
	// A pool refused a slot with none in flight has no scrape of its own
	// whose end would queue its servers again: the slot freed here may be
	// its share.
	for len(m.starved) > 0 {
		ps := m.starved[0]
		m.starved[0] = nil
		m.starved = m.starved[1:]
		ps.starved = false
		if m.pools[ps.pool.Key] == ps && len(ps.parked) > 0 {
			m.unparkLocked(ps, 1)
			break
		}
	}
	if len(m.starved) == 0 {
		m.starved = nil
	}
}

// unparkLocked queues up to n of the servers waiting for ps's slots again
// (all of them when n is negative), those that waited longest first, at
// their due times. One slot freed queues one server: queuing every
// waiting server for it would have all but one of them taken off the
// queue and parked again, each time a slot frees, at a pool with hundreds
// of servers due.
func (m *Manager) unparkLocked(ps *poolSubs, n int) {
	for n != 0 && len(ps.parked) > 0 {
		s := ps.parked[0]
		ps.parked[0] = nil
		ps.parked = ps.parked[1:]
		if s.parkedOn != ps {
			continue
		}
		s.parkedOn = nil
		m.scheduleLocked(s, s.next)
		n--
	}
	if len(ps.parked) == 0 {
		ps.parked = nil
	}
}

// job is a server's scrape in flight: due at due, interval after the
// last, charged expected by the budget when it started.
type job struct {
	due      time.Time
	interval time.Duration
	expected time.Duration
}

// scrape is one scrape of s through net/http and the publication of its
// result to every endpoint resolving to it.
func (m *Manager) scrape(s *server) {
	s.cpu.start(m.started.Add(1)%timedEvery == 1)
	met, err := m.fetch(s.ctx, s)
	// A cancelled scrape is no failure: its server left, or the manager
	// stopped.
	cancelled := s.ctx.Err() != nil
	s.cancel()
	m.finish(s, polled{met: met, err: err, cancelled: cancelled, cpu: s.cpu.total}, s.cpu.on)
}

// parsePolled parses the page of a poller's exchange, on the poller.
func (m *Manager) parsePolled(c *fetch.Conn, page []byte) error {
	s := c.Owner.(*server)
	var err error
	s.polled, err = m.parse(s, page)
	return err
}

// completePolled is a poller's report of the end of a server's scrape.
func (m *Manager) completePolled(c *fetch.Conn, r fetch.Result) {
	s := c.Owner.(*server)
	met := s.polled
	s.polled = datastore.Metrics{}
	if r.Err != nil || r.Cancelled {
		met = datastore.Metrics{}
	}
	m.finish(s, polled{met: met, err: r.Err, cancelled: r.Cancelled, cpu: r.CPU, read: r.Read}, true)
}

// polled is a scrape's result.
type polled struct {
	met       datastore.Metrics
	err       error
	cancelled bool
	// cpu is the CPU time of the scrape: its share of its poller's
	// wake-ups, or its net/http parse.
	cpu time.Duration
	// read is the bytes of a polled response read.
	read int64
}

// finish publishes the result of s's scrape to every endpoint resolving
// to it and queues the server for its next scrape; measured says whether
// r.cpu was measured.
func (m *Manager) finish(s *server, r polled, measured bool) {
	defer m.inflight.Done()
	j := s.job
	interval, met, err := j.interval, r.met, r.err
	busy := s.busy
	if !r.cancelled {
		m.scrapes.Add(1)
		if err != nil {
			m.errors.Add(1)
		}
		met.ScrapedAt = time.Now()
		var moved []*sub
		interval, busy, moved = m.publish(s, &met, err, interval)
		if len(moved) > 0 {
			m.move(s, moved)
		}
	}
	m.budget.charge(r.cpu, j.expected, measured)
	m.mu.Lock()
	s.running = false
	if s.gone || (!s.busy && m.kept.Load() > int64(m.opts.MaxIdleConns)) {
		// An idle server gives its connection up past MaxIdleConns kept:
		// a busy one keeps it, an idle one dials again next time.
		m.dropConn(s)
	}
	if s.done != nil {
		close(s.done)
		s.done = nil
	}
	m.releaseLocked(s)
	if s.demanded {
		s.demanded, interval, busy = false, m.opts.RefreshInterval, true
	}
	if busy && !s.busy {
		m.planPoolsOfLocked(s)
	}
	s.busy = busy
	switch {
	case r.cancelled:
	case err != nil:
		// A failing server is asked again ever more rarely, not at once:
		// servers that hang hold their slots for the timeout each time.
		s.failures++
		interval = max(interval, m.backoff(s.failures))
	default:
		s.failures = 0
	}
	if s.busy {
		interval = max(interval, m.shareLocked(s))
	}
	interval = m.costlyLocked(s, r, measured, interval)
	s.interval = interval
	if !m.stopped {
		// From the due time, as a ticker: a scrape started late (no free
		// slot, a busy machine) does not push every later one back. One due
		// while this one ran is dropped, as a ticker drops ticks.
		next := j.due.Add(max(interval, m.opts.RefreshInterval))
		if now := time.Now(); next.Before(now) {
			next = now
		}
		m.scheduleLocked(s, next)
	}
	m.mu.Unlock()
	<-m.slots
}

// costlyLocked lengthens the interval of a server whose scrape cost more
// CPU than its share (MaxServerCPUShare) pays for at that interval, so
// that its pages take no more of a poller than the share: counted on its
// pools and logged when it starts and stops.
func (m *Manager) costlyLocked(s *server, r polled, measured bool, interval time.Duration) time.Duration {
	share := m.opts.MaxServerCPUShare
	if share <= 0 || !measured || r.cancelled {
		return interval
	}
	// A mean over the last few scrapes: a server's first scrape (a new
	// connection, a parser grown to its page) costs more than the rest.
	if s.cost == 0 {
		s.cost = r.cpu
	} else {
		s.cost += (r.cpu - s.cost) / 4
	}
	need := time.Duration(float64(s.cost) / share)
	costly := need > max(interval, m.opts.RefreshInterval)
	if costly != s.costly {
		s.costly = costly
		for sb := range s.subs {
			if costly {
				m.log.Info("model server's metrics page costs more than its share of scrape time; scraped less often", "pool", sb.pool.Key.String(), "endpoint", sb.ep.Address, "scrapeCPU", s.cost, "interval", need, "maxServerCPUShare", share)
			} else {
				m.log.V(2).Info("model server's metrics page fits its share of scrape time again", "pool", sb.pool.Key.String(), "endpoint", sb.ep.Address)
			}
		}
	}
	if !costly {
		return interval
	}
	for sb := range s.subs {
		m.stats.costly.WithLabelValues(sb.pool.Key.Namespace, sb.pool.Key.Name).Inc()
	}
	return min(need, m.opts.MaxErrorBackoff)
}

// backoff is the interval after a server's nth failure in a row: doubling
// from RefreshInterval up to MaxErrorBackoff, up to a tenth shorter at
// random so that servers that failed together drift apart.
func (m *Manager) backoff(n int) time.Duration {
	d := m.opts.MaxErrorBackoff
	if n < 30 {
		d = min(m.opts.RefreshInterval<<n, d)
	}
	return d - time.Duration(rand.Int64N(int64(d/10)+1))
}

// nextInterval is a server's next interval after prev: RefreshInterval
// while one of its pools is busy, else doubling up to IdleRefreshInterval
// (IdleRefreshInterval at once after the first scrape, prev zero).
func (m *Manager) nextInterval(prev time.Duration, busy bool) time.Duration {
	r, idle := m.opts.RefreshInterval, m.opts.IdleRefreshInterval
	if busy || idle <= r {
		return r
	}
	next := min(max(2*prev, r), idle)
	if prev == 0 {
		// A server first scraped while its pools are idle (a picker's
		// start) starts at the idle interval: 50,000 of them doubling up
		// from RefreshInterval would be ten scrapes each in the first
		// idle interval.
		next = idle
	}
	// Up to a tenth shorter at random: servers that appeared together
	// (a picker's start) drift apart instead of being scraped in one burst
	// every idle interval.
	return next - time.Duration(rand.Int64N(int64(next/10)+1))
}

// publish gives the result to the endpoints still resolving to s, and
// returns the server's next interval, whether one of its pools is busy, and
// the endpoints that resolve elsewhere now (their pool's annotations or
// their pod's engine label changed).
func (m *Manager) publish(s *server, met *datastore.Metrics, err error, prev time.Duration) (time.Duration, bool, []*sub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := false
	for sb := range s.subs {
		if met.ScrapedAt.Sub(sb.pool.LastRequest()) <= m.opts.DemandWindow {
			busy = true
			break
		}
	}
	next := m.nextInterval(prev, busy)
	// A busy server's values go stale by the staleness threshold alone.
	if next > m.opts.RefreshInterval {
		met.Interval = next
	}
	var moved []*sub
	for sb := range s.subs {
		if sb.resolve(&m.opts).key() != s.key {
			moved = append(moved, sb)
			continue
		}
		sb.published(m, met, err)
	}
	return next, busy, moved
}

// PoolDemanded has the servers of a pool that was idle scraped at once: its
// request is routed meanwhile on their last values and the in-flight
// counts, and its next ones on fresh values. It is called on the request
// path, so it only notes the pool for the dispatcher, which it wakes
// demandDelay later.
func (m *Manager) PoolDemanded(pool *datastore.Pool, idle time.Duration) {
	if m.opts.IdleRefreshInterval <= m.opts.RefreshInterval || idle < m.opts.DemandWindow {
		return
	}
	m.demandMu.Lock()
	if m.ended {
		m.demandMu.Unlock()
		return
	}
	m.demanded = append(m.demanded, pool)
	if len(m.demanded) == 1 {
		// Not at once: the dispatcher and the scrapes it starts would
		// take the cores from the request being picked.
		m.demandTimer.Reset(demandDelay)
	}
	m.demandMu.Unlock()
}

// dispatchQuantum is the least time the dispatcher waits for the next
// scrape due.
const dispatchQuantum = time.Millisecond

// demandDelay is how long after the first request of an idle pool its
// servers' scrapes start: after that request's answer has gone.
const demandDelay = time.Millisecond

func (m *Manager) wakeDispatcher() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// takeDemanded returns the pools PoolDemanded noted since the last call.
func (m *Manager) takeDemanded() []*datastore.Pool {
	m.demandMu.Lock()
	defer m.demandMu.Unlock()
	d := m.demanded
	m.demanded = nil
	return d
}

// demandLocked queues the servers of a demanded pool for a scrape now.
func (m *Manager) demandLocked(pool *datastore.Pool, now time.Time) {
	ps := m.pools[pool.Key]
	if ps == nil || ps.pool != pool {
		return
	}
	for _, sb := range ps.subs {
		s := sb.srv
		switch {
		case s == nil:
		case s.running:
			s.demanded = true
		case s.failures > 0:
			// Its backoff stands; its last values are stale by now.
			s.setBusyLocked(m, true)
		default:
			s.interval = m.opts.RefreshInterval
			s.setBusyLocked(m, true)
			m.scheduleLocked(s, now)
		}
	}
}

// move attaches subs, resolved by s's scrape to other targets, to their
// servers.
func (m *Manager) move(s *server, moved []*sub) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range moved {
		if sb.srv != s {
			continue // removed meanwhile
		}
		// s is this goroutine's own scrape: nothing to wait for.
		m.detachLocked(sb)
		m.attachLocked(sb)
	}
}

// scheduleLocked queues s for a scrape at at, or earlier if it is queued
// for earlier already. A server in flight is queued when its scrape ends.
func (m *Manager) scheduleLocked(s *server, at time.Time) {
	if s.gone || s.running {
		return
	}
	if s.parkedOn != nil {
		// Queued when its pool's slot frees.
		s.next = minTime(s.next, at)
		return
	}
	q := &m.idle
	if s.busy {
		q = &m.busy
	}
	if s.index >= 0 && s.queue != q {
		at = minTime(s.next, at)
		heap.Remove(s.queue, s.index)
	}
	if s.index >= 0 {
		if !at.Before(s.next) {
			return
		}
		s.next = at
		heap.Fix(q, s.index)
	} else {
		s.next = at
		s.queue = q
		heap.Push(q, s)
	}
	if s.index == 0 {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// setBusyLocked moves a queued server between the busy and the idle queue.
func (s *server) setBusyLocked(m *Manager, busy bool) {
	if s.busy == busy {
		return
	}
	s.busy = busy
	if busy {
		m.planPoolsOfLocked(s)
	}
	if s.index >= 0 {
		m.scheduleLocked(s, s.next)
	}
}

// planPoolsOfLocked has the next plan look at the pools of s, a busy
// server.
func (m *Manager) planPoolsOfLocked(s *server) {
	for sb := range s.subs {
		if ps := m.pools[sb.pool.Key]; ps != nil && ps.pool == sb.pool {
			m.planLaterLocked(ps)
		}
	}
}

// planLaterLocked has the next plan look at ps. A pool new to the plans
// counts its requests from now: those before were made while it needed
// no plan.
func (m *Manager) planLaterLocked(ps *poolSubs) {
	if _, ok := m.planned[ps]; !ok {
		m.planned[ps] = struct{}{}
		ps.requests = ps.pool.Requests()
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// attachLocked resolves sb's target and attaches it to that server, made
// and scraped at once when new.
func (m *Manager) attachLocked(sb *sub) {
	t := sb.resolve(&m.opts)
	key := t.key()
	s := m.servers[key]
	if s == nil {
		s = newServer(&m.opts, t)
		s.poller = m.nextPoller
		m.nextPoller++
		m.servers[key] = s
		// New in a busy pool: scraped before the idle servers.
		s.busy = time.Since(sb.pool.LastRequest()) <= m.opts.DemandWindow
	}
	s.mu.Lock()
	s.subs[sb] = struct{}{}
	s.mu.Unlock()
	sb.srv = s
	if s.busy {
		m.planPoolsOfLocked(s)
	}
	// A new endpoint is known within a round trip, as with a server of its
	// own; a server scraped since the last interval began is not asked again.
	if time.Since(s.lastStart) >= m.opts.RefreshInterval {
		m.scheduleLocked(s, time.Now())
	}
}

// detachLocked takes sb off its server. When no endpoint is left on the
// server, the server goes; the returned channel, if not nil, closes when its
// scrape in flight, cancelled now, has ended.
func (m *Manager) detachLocked(sb *sub) <-chan struct{} {
	s := sb.srv
	if s == nil {
		return nil
	}
	sb.srv = nil
	s.mu.Lock()
	delete(s.subs, sb)
	empty := len(s.subs) == 0
	s.mu.Unlock()
	if !empty {
		return nil
	}
	s.gone = true
	if m.servers[s.key] == s {
		delete(m.servers, s.key)
	}
	if s.index >= 0 {
		heap.Remove(s.queue, s.index)
	}
	if ps := s.parkedOn; ps != nil {
		s.parkedOn = nil
		ps.parked = slices.DeleteFunc(ps.parked, func(p *server) bool { return p == s })
	}
	if s.running {
		if s.conn != nil {
			m.pollers[s.poller%len(m.pollers)].Cancel(s.conn)
		} else {
			s.cancel()
		}
		return s.doneLocked()
	}
	m.dropConn(s)
	return nil
}

// EndpointsChanged scrapes added endpoints and stops scraping removed ones;
// when it returns, a server no endpoint resolves to any more has no scrape
// in flight and gets no request after that.
func (m *Manager) EndpointsChanged(pool *datastore.Pool, added, removed []*datastore.Endpoint) {
	m.mu.Lock()
	var ending []<-chan struct{}
	detach := func(sb *sub) {
		if done := m.detachLocked(sb); done != nil {
			ending = append(ending, done)
		}
	}
	ps := m.pools[pool.Key]
	if ps == nil || ps.pool != pool {
		if ps != nil {
			// A pool of the same name came back before we heard the old one
			// leave; its endpoints go with it.
			for _, sb := range ps.subs {
				detach(sb)
			}
			m.unparkLocked(ps, -1)
		}
		ps = &poolSubs{pool: pool, subs: map[datastore.EndpointKey]*sub{}, slots: m.share.Party(pool.Key.Namespace, pool.Key.Name)}
		m.pools[pool.Key] = ps
	}
	// Removals first: an endpoint can leave and come back under the same key
	// with a new address in one change.
	for _, e := range removed {
		if sb := ps.subs[e.Key()]; sb != nil && sb.ep.Address == e.Address {
			delete(ps.subs, e.Key())
			detach(sb)
		}
	}
	for _, e := range added {
		if old := ps.subs[e.Key()]; old != nil {
			detach(old)
		}
		sb := &sub{pool: pool, ep: e, scrapesCounter: m.stats.scrapes.WithLabelValues(pool.Key.Namespace, pool.Key.Name)}
		ps.subs[e.Key()] = sb
		m.attachLocked(sb)
	}
	if len(ps.subs) == 0 {
		delete(m.pools, pool.Key)
		m.unparkLocked(ps, -1)
		m.share.Forget(pool.Key.Namespace, pool.Key.Name)
	}
	m.mu.Unlock()
	for _, done := range ending {
		<-done
	}
}

// PoolRemoved stops scraping the pool's endpoints (their servers go on for
// other pools that hold them), waits for scrapes of servers that went, and
// drops the pool's exported series.
func (m *Manager) PoolRemoved(pool *datastore.Pool) {
	m.mu.Lock()
	var ending []<-chan struct{}
	if ps := m.pools[pool.Key]; ps != nil && ps.pool == pool {
		delete(m.pools, pool.Key)
		for _, sb := range ps.subs {
			if done := m.detachLocked(sb); done != nil {
				ending = append(ending, done)
			}
		}
		m.unparkLocked(ps, -1)
	}
	m.share.Forget(pool.Key.Namespace, pool.Key.Name)
	m.mu.Unlock()
	for _, done := range ending {
		<-done
	}
	m.stats.forgetPool(pool.Key)
}

// scrapedPools returns the pools with scraped endpoints, for the aggregates.
func (m *Manager) scrapedPools() []*datastore.Pool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*datastore.Pool, 0, len(m.pools))
	for _, ps := range m.pools {
		out = append(out, ps.pool)
	}
	return out
}
