// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// The dispatcher: starts the scrapes of due servers and queues each again when its scrape ends.

package scrape

import (
	"container/heap"
	"context"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

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

// dispatchQuantum is the least time the dispatcher waits for the next
// scrape due.
const dispatchQuantum = time.Millisecond

func (m *Manager) wakeDispatcher() {
	select {
	case m.wake <- struct{}{}:
	default:
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

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
