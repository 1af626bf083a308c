// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// A model server in several pools is scraped once per interval, and every
// pool's endpoint gets the result; it stays scraped for the pools that keep
// it when another leaves.
func TestSharedServerScrapedOnce(t *testing.T) {
	servers := startModelServers(t, 2)
	for i, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 3 + i, KVCacheUsage: 0.5}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: 20 * time.Millisecond})
	shared := servers[0]
	pools := []*datastore.Pool{
		h.addPool("a", nil, shared.port, shared, servers[1]),
		h.addPool("b", nil, shared.port, shared),
		h.addPool("c", nil, shared.port, shared),
	}
	for _, p := range pools {
		h.await(t, "a scrape for pool "+p.Key.Name, func(ev scrapeEvent) bool { return ev.pool == p.Key && ev.err == nil })
	}
	if n := h.m.Stats().Servers; n != 2 {
		t.Fatalf("%d servers scraped, want 2 (one shared by three pools)", n)
	}

	// Count the shared server's requests against pool a's scrapes of it.
	const rounds = 20
	before := shared.requests.Load()
	perPool := map[datastore.PoolKey]int{}
	h.await(t, "rounds of scrapes", func(ev scrapeEvent) bool {
		if ev.address == shared.addr {
			perPool[ev.pool]++
		}
		return perPool[pools[0].Key] >= rounds
	})
	got := shared.requests.Load() - before
	// One request may be in flight at either end of the window.
	if got > rounds+1 {
		t.Errorf("shared server got %d requests while pool a saw %d scrapes: scraped more than once per round", got, rounds)
	}
	for _, p := range pools {
		m := endpointOf(t, p, shared.addr).Metrics()
		if m == nil || m.WaitingRequests != 3 || !m.Fresh(time.Now(), time.Second) {
			t.Errorf("pool %s: shared endpoint metrics %+v", p.Key.Name, m)
		}
	}

	// Pool b leaves; a and c keep the server.
	h.reg.Remove(pools[1].Key)
	h.awaitScrapes(t, shared.addr, 5)
	if n := h.m.Stats().Servers; n != 2 {
		t.Errorf("%d servers after one sharing pool left, want 2", n)
	}
	// Pools a and c leave the shared server: it goes, the other stays.
	pools[0].SetPods(pods(nil, servers[1]))
	h.reg.Remove(pools[2].Key)
	n := shared.requests.Load()
	h.awaitScrapes(t, servers[1].addr, 5)
	if got := shared.requests.Load(); got != n {
		t.Errorf("server no pool holds got %d requests", got-n)
	}
	if n := h.m.Stats().Servers; n != 1 {
		t.Errorf("%d servers left, want 1", n)
	}
}

// No more than MaxConcurrentScrapes scrapes are in flight, and slow servers
// do not starve the others of their turns.
func TestConcurrencyBound(t *testing.T) {
	const limit = 2
	servers := startModelServers(t, 5)
	page := mustPage(t, vllmpage.State{Running: 1}, vllmpage.Options{})
	var inFlight, peak atomic.Int64
	for _, s := range servers {
		s.set(func(w http.ResponseWriter, r *http.Request) {
			n := inFlight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			// A slow server: holds the request a while.
			select {
			case <-time.After(30 * time.Millisecond):
			case <-r.Context().Done():
			}
			inFlight.Add(-1)
			w.Write(page) //nolint:errcheck
		})
	}
	h := newHarness(t, Options{RefreshInterval: 5 * time.Millisecond, MaxConcurrentScrapes: limit, MaxConcurrentScrapesPerPool: limit})
	h.addPool("pool", nil, servers[0].port, servers...)
	for _, s := range servers {
		h.awaitScrapes(t, s.addr, 3)
	}
	if p := peak.Load(); p > limit {
		t.Errorf("%d scrapes in flight at once, want at most %d", p, limit)
	}
	if p := peak.Load(); p < limit {
		t.Errorf("at most %d scrapes in flight, want %d: the bound is not used", p, limit)
	}
}

// A failing server is asked again ever more rarely (its interval doubling
// up to MaxErrorBackoff), not at once, and is scraped as before when it
// recovers.
func TestFailingServerBacksOff(t *testing.T) {
	const (
		refresh = 10 * time.Millisecond
		ceiling = 160 * time.Millisecond
		errs    = 7
	)
	s := startModelServers(t, 1)[0]
	s.serve(http.StatusInternalServerError, nil)
	h := newHarness(t, Options{RefreshInterval: refresh, MaxErrorBackoff: ceiling})
	h.addPool("pool", nil, s.port, s)
	var at []time.Time
	for range errs {
		h.awaitError(t, s.addr, "status")
		at = append(at, time.Now())
	}
	// The gaps after failures 1..6 were announced as 20, 40, 80, 160, 160,
	// 160 ms, less up to a tenth of jitter each; a scrape started late is
	// followed by a shorter gap, so their sum is what is checked.
	var announced time.Duration
	for n := 1; n < errs; n++ {
		announced += min(refresh<<n, ceiling) * 9 / 10
	}
	if took := at[errs-1].Sub(at[0]); took < announced {
		t.Errorf("%d failed scrapes in %v, want them spread over at least %v", errs, took, announced)
	}
	s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	h.awaitSuccess(t, s.addr)
	// Recovered: every RefreshInterval again, so ten scrapes take far less
	// than the backoff ceiling each.
	start := time.Now()
	h.awaitScrapes(t, s.addr, 10)
	if took := time.Since(start); took >= 10*ceiling*9/10 {
		t.Errorf("10 scrapes after recovery took %v: still backing off", took)
	}
}

// Servers that hang hold at most their pool's share of the scrape slots:
// another pool's servers are scraped meanwhile, though the hanging pool has
// more servers than there are slots.
func TestHangingPoolStallsOnlyItself(t *testing.T) {
	servers := startModelServers(t, 8)
	hanging, healthy := servers[:6], servers[6:]
	arrived := make(chan struct{}, 100)
	for _, s := range hanging {
		s.set(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			<-r.Context().Done()
		})
	}
	for _, s := range healthy {
		s.servePage(t, vllmpage.State{Running: 2}, vllmpage.Options{})
	}
	// The hanging scrapes end only when the manager stops.
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond, Timeout: time.Hour, MaxConcurrentScrapes: 4, MaxConcurrentScrapesPerPool: 2})
	h.addPool("hanging", nil, hanging[0].port, hanging...)
	for range 2 {
		<-arrived
	}
	h.addPool("healthy", nil, healthy[0].port, healthy...)
	for _, s := range healthy {
		h.awaitScrapes(t, s.addr, 20)
	}
	select {
	case <-arrived:
		t.Error("a third server of the hanging pool was asked while two of its scrapes hung")
	default:
	}
}

// A slot freed at a pool with many servers waiting for its slots queues
// one of them, not all: the others stay aside instead of being taken off
// the queue and set aside again, each time a slot frees.
func TestFreedSlotQueuesOneWaitingServer(t *testing.T) {
	const (
		n       = 40
		perPool = 2
		freed   = 10
	)
	servers := startModelServers(t, n)
	arrived := make(chan string, 4*n)
	// A request is answered when the test hands its server a token.
	tokens := make(chan struct{})
	page := mustPage(t, vllmpage.State{Running: 1}, vllmpage.Options{})
	for _, s := range servers {
		s.set(func(w http.ResponseWriter, r *http.Request) {
			arrived <- s.addr
			select {
			case <-tokens:
				w.Header().Set("Content-Length", strconv.Itoa(len(page)))
				w.Write(page) //nolint:errcheck
			case <-r.Context().Done():
			}
		})
	}
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond, Timeout: time.Hour, MaxConcurrentScrapesPerPool: perPool})
	h.addPool("big", nil, servers[0].port, servers...)
	for range perPool {
		<-arrived
	}
	// Each freed slot starts one more scrape.
	for range freed {
		tokens <- struct{}{}
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("a freed slot started no scrape of a waiting server")
		}
	}
	h.m.mu.Lock()
	parks := h.m.parks
	h.m.mu.Unlock()
	// Each server is set aside once when first due, and each answered one
	// once more when due again; queuing every waiting server per freed
	// slot sets aside about n more per slot.
	if limit := n + 3*freed; parks > limit {
		t.Errorf("servers set aside %d times for %d freed slots of a %d-server pool, want at most %d", parks, freed, n, limit)
	}
}
