// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Subscriptions: pools' endpoints attached to the servers they resolve to, as pools change.

package scrape

import (
	"container/heap"
	"slices"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

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
