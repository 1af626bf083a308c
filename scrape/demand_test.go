// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"net/http"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// An idle pool's servers are scraped at the idle interval from the start,
// and ever more rarely after the pool's requests stop, their values stamped
// valid for two intervals; the pool's next request has them scraped at once,
// and while requests come they are scraped every RefreshInterval, a failing
// one going stale by the staleness threshold as before.
func TestFreshnessFollowsDemand(t *testing.T) {
	const (
		refresh   = 20 * time.Millisecond
		window    = 500 * time.Millisecond
		staleness = 50 * time.Millisecond
		decayed   = 320 * time.Millisecond
	)
	s := startModelServers(t, 1)[0]
	s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	h := newHarness(t, Options{RefreshInterval: refresh, IdleRefreshInterval: time.Hour, DemandWindow: window, StalenessThreshold: staleness})
	p := h.addPool("pool", nil, s.port, s)
	ep := endpointOf(t, p, s.addr)

	// Idle from the start: scraped once, then at the idle interval (less up
	// to a tenth of jitter), not doubling up from RefreshInterval.
	h.awaitSuccess(t, s.addr)
	m := ep.Metrics()
	if m.Interval < time.Hour*9/10 {
		t.Fatalf("a server idle from the start has interval %v after its first scrape, want the idle interval", m.Interval)
	}
	// Valid for two intervals, well past the staleness threshold.
	if at := m.ScrapedAt.Add(decayed); !m.Fresh(at, staleness) {
		t.Errorf("an idle server's values, %v old, are not fresh with interval %v", decayed, m.Interval)
	}

	// The first request: a scrape at once, not one interval (now at least
	// 640 ms) later.
	asked := time.Now()
	p.NoteRequest(asked)
	h.awaitSuccess(t, s.addr)
	if took := time.Since(asked); took >= decayed {
		t.Errorf("the first request's refresh came %v after it; the next idle scrape was due %v after the last", took, 2*m.Interval)
	}
	// Busy: every RefreshInterval, stamped as before (no extended validity).
	for range 5 {
		p.NoteRequest(time.Now())
		h.awaitSuccess(t, s.addr)
		if got := ep.Metrics().Interval; got != 0 {
			t.Fatalf("a busy server's values stamped with interval %v", got)
		}
	}

	// Idle again: the interval doubles, scrape after scrape.
	var first, last time.Time
	var prev, announced time.Duration
	for ep.Metrics().Interval < decayed {
		h.awaitSuccess(t, s.addr)
		m := ep.Metrics()
		if !last.IsZero() && m.Interval != 0 && m.Interval < prev {
			t.Fatalf("idle interval went down from %v to %v", prev, m.Interval)
		}
		if first.IsZero() {
			first = m.ScrapedAt
		} else if m.ScrapedAt != last {
			announced += prev
		}
		last, prev = m.ScrapedAt, m.Interval
	}
	// Scrapes are due one interval after the last was due, as a ticker's
	// ticks: one that started late (a loaded machine) is followed by a
	// shorter gap, so single gaps prove nothing. Over the whole decay the
	// intervals announced were waited for (less up to 10 % of jitter, and
	// how late the first scrape started).
	if elapsed := last.Sub(first); elapsed < announced/2 {
		t.Fatalf("the idle scrapes took %v in all, but announced intervals of %v", elapsed, announced)
	}

	// Then a request to a failing server: its last values lose their idle
	// validity and go stale by the threshold.
	good := ep.Metrics()
	s.serve(http.StatusInternalServerError, nil)
	p.NoteRequest(time.Now())
	h.awaitError(t, s.addr, "status")
	got := ep.Metrics()
	if got.ScrapedAt != good.ScrapedAt || got.WaitingRequests != good.WaitingRequests || got.Interval != 0 {
		t.Fatalf("after a failed scrape of a busy pool: %+v, want the last good values with no idle validity", got)
	}
	if got.Fresh(good.ScrapedAt.Add(2*staleness), staleness) {
		t.Error("a failing busy server's values are fresh past the staleness threshold")
	}
}

// The request that ends an idle spell does not wait for the scraper: with
// the scraper's lock held (as by a plan over every pool, or a busy
// dispatcher), NoteRequest returns, and the pool's servers are scraped once
// the lock is free.
func TestDemandNeverWaitsForTheScraper(t *testing.T) {
	s := startModelServers(t, 1)[0]
	s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	h := newHarness(t, Options{RefreshInterval: 20 * time.Millisecond, IdleRefreshInterval: time.Hour, DemandWindow: 100 * time.Millisecond})
	p := h.addPool("pool", nil, s.port, s)
	h.awaitSuccess(t, s.addr)
	// Never requested: the first request is a demand.
	ep := endpointOf(t, p, s.addr)
	first := ep.Metrics().ScrapedAt

	h.m.mu.Lock()
	noted := make(chan struct{})
	go func() {
		p.NoteRequest(time.Now())
		close(noted)
	}()
	select {
	case <-noted:
	case <-time.After(10 * time.Second):
		h.m.mu.Unlock()
		t.Fatal("NoteRequest waited for the scraper's lock")
	}
	h.m.mu.Unlock()
	h.awaitSuccess(t, s.addr)
	if got := ep.Metrics(); !got.ScrapedAt.After(first) {
		t.Fatalf("the demanded pool's server was not scraped again (last scrape %v)", got.ScrapedAt)
	}
}
