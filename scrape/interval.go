// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// How often a server is scraped: busy and idle intervals, demand, failure backoff, costly pages.

package scrape

import (
	"math/rand/v2"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

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

// demandDelay is how long after the first request of an idle pool its
// servers' scrapes start: after that request's answer has gone.
const demandDelay = time.Millisecond

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
