// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Slot parking: each pool's share of the scrapes in flight, and its servers set aside meanwhile.

package scrape

import "slices"

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
