package scrape

import (
	"context"
	"time"
)

// The per-endpoint loop is the design the scheduler replaced: a goroutine
// and a ticker for each endpoint of each pool, each scraping its own copy of
// a server that several pools hold. Options.PerEndpointLoop selects it; it
// is kept as bench/scrape's baseline only.

// attachLoopLocked gives sb a server and a loop of its own, started now or
// by Start.
func (m *Manager) attachLoopLocked(sb *sub, t target) {
	s := newServer(&m.opts, t)
	s.subs[sb] = struct{}{}
	sb.srv = s
	switch {
	case m.ctx == nil:
		m.unstarted = append(m.unstarted, s)
	case !m.stopped:
		m.startLoopLocked(m.ctx, s)
	}
}

func (m *Manager) startLoopLocked(ctx context.Context, s *server) {
	s.running = true
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	m.inflight.Add(1)
	go m.loop(s)
}

func (m *Manager) loop(s *server) {
	defer m.inflight.Done()
	defer close(s.done)
	defer m.dropConn(s)
	ticker := time.NewTicker(m.opts.RefreshInterval)
	defer ticker.Stop()
	for {
		met, err := m.fetch(s.ctx, s)
		if s.ctx.Err() != nil {
			return
		}
		m.scrapes.Add(1)
		if err != nil {
			m.errors.Add(1)
		}
		met.ScrapedAt = time.Now()
		if _, _, moved := m.publish(s, &met, err, m.opts.RefreshInterval); len(moved) > 0 {
			// The endpoint's target changed: the loop follows it.
			next := newServer(&m.opts, moved[0].target)
			m.dropConn(s)
			s.key, s.target, s.request = next.key, next.target, next.request
		}
		select {
		case <-s.ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
