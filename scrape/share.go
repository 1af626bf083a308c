// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"slices"
	"time"
)

// planInterval is how often the busy pools' shares of the budget are set.
const planInterval = time.Second

// planLocked shares the scrapes the budget pays for between the busy
// pools when it cannot pay for every busy server at RefreshInterval: the
// idle servers' scrapes are set aside first (at least a tenth goes to the
// busy ones), the rest goes to the busy pools in proportion to their
// requests since the last plan, a pool that needs less than its share
// leaving the rest to the others (water-filling). A pool's busy servers
// are then scraped every n/share seconds, n their number.
func (m *Manager) planLocked(now time.Time) {
	rate := m.budget.rate()
	type want struct {
		ps     *poolSubs
		need   float64 // scrapes per second at RefreshInterval
		weight float64 // requests since the last plan, plus one
	}
	var wants []want
	var slowed []slowedPool
	demand, weights := 0.0, 0.0
	// However the plan ends, the servers of a pool it gives a shorter
	// interval than the last are due by that one: a server takes its
	// interval when its scrape ends, and one slowed to seconds would
	// otherwise keep its late due time through the plans that have
	// restored it.
	defer func() { m.hastenLocked(slowed) }()
	for ps := range m.planned {
		if m.pools[ps.pool.Key] != ps {
			// Removed: its parked servers were queued again then.
			delete(m.planned, ps)
			continue
		}
		if free := m.opts.MaxConcurrentScrapesPerPool - ps.inflight; free > 0 && len(ps.parked) > 0 {
			// A server queued again for a freed slot that left before
			// its turn passed the slot on to no one.
			m.unparkLocked(ps, free)
		}
		if ps.interval > 0 {
			slowed = append(slowed, slowedPool{ps, ps.interval})
		}
		ps.interval = 0
		requests := ps.pool.Requests()
		weight := float64(requests-ps.requests) + 1
		ps.requests = requests
		n := 0
		for _, sb := range ps.subs {
			if sb.srv != nil && sb.srv.busy {
				n++
			}
		}
		if n == 0 && len(ps.parked) == 0 {
			delete(m.planned, ps)
		}
		if n == 0 || rate == 0 {
			continue
		}
		need := float64(n) / m.opts.RefreshInterval.Seconds()
		wants = append(wants, want{ps, need, weight})
		demand += need
		weights += weight
	}
	avail := rate
	if m.opts.IdleRefreshInterval > m.opts.RefreshInterval {
		avail -= float64(len(m.idle)) / m.opts.IdleRefreshInterval.Seconds()
	}
	avail = max(avail, rate/10)
	wasSlowed := m.slowed
	m.slowed, m.longest = 0, 0
	if demand <= avail {
		if wasSlowed > 0 {
			m.log.Info("metrics scrape budget covers every busy model server again", "budgetCores", m.budget.cores, "scrapesPerSecond", int(rate), "busyDemandPerSecond", int(demand))
		}
		return
	}
	// Pools that need least per unit of weight are served in full first.
	slices.SortFunc(wants, func(a, b want) int {
		x, y := a.need/a.weight, b.need/b.weight
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	for _, w := range wants {
		share := avail * w.weight / weights
		avail, weights = avail-min(share, w.need), weights-w.weight
		if share >= w.need {
			continue
		}
		w.ps.interval = time.Duration(w.need / share * float64(m.opts.RefreshInterval))
		m.slowed++
		m.longest = max(m.longest, w.ps.interval)
	}
	if wasSlowed == 0 {
		m.log.Info("metrics scrape budget too small for every busy model server at the refresh interval; busy pools share it by request rate",
			"budgetCores", m.budget.cores, "scrapesPerSecond", int(rate), "busyDemandPerSecond", int(demand), "slowedPools", m.slowed)
	} else {
		m.log.V(4).Info("metrics scrape budget shared", "scrapesPerSecond", int(rate), "busyDemandPerSecond", int(demand), "slowedPools", m.slowed)
	}
}

// slowedPool is a pool with the interval the last plan gave it.
type slowedPool struct {
	ps       *poolSubs
	interval time.Duration
}

// hastenLocked brings forward the queued busy servers of the pools whose
// interval the plan shortened, each to its last start plus the new one.
func (m *Manager) hastenLocked(slowed []slowedPool) {
	for _, sp := range slowed {
		ps := sp.ps
		if ps.interval >= sp.interval || m.pools[ps.pool.Key] != ps {
			continue
		}
		for _, sb := range ps.subs {
			s := sb.srv
			if s == nil || !s.busy || s.running || s.index < 0 && s.parkedOn == nil {
				continue
			}
			interval := max(m.shareLocked(s), m.opts.RefreshInterval)
			if at := s.lastStart.Add(interval); at.Before(s.next) {
				s.interval = interval
				m.scheduleLocked(s, at)
			}
		}
	}
}

// shareLocked is the interval the budget allows a busy server: the
// shortest of its busy pools' intervals, zero when one is not slowed.
func (m *Manager) shareLocked(s *server) time.Duration {
	interval := time.Duration(-1)
	for sb := range s.subs {
		ps := m.pools[sb.pool.Key]
		if ps == nil || ps.pool != sb.pool {
			continue
		}
		if interval < 0 || ps.interval < interval {
			interval = ps.interval
		}
	}
	return max(interval, 0)
}
