// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// TestPoolServedAgainUnderItsName drives what the pool controller does
// when an InferencePool is deleted and created again under its name: the
// registry removes the pool (PoolRemoved) before it makes a new *Pool of
// that key, whose watch then lists its pods (EndpointsChanged); the old
// pool's watch may still deliver pods, which the registry drops. The new
// pool is scraped, keeps its account of the scrape slots (exported) after
// the old pool's last scrape gave its slot back, and the old pool's late
// pods change nothing.
func TestPoolServedAgainUnderItsName(t *testing.T) {
	cases := []struct {
		name string
		// shared: the old pool's server is also another pool's, and its
		// scrape is in flight, holding the old pool's slot, while the
		// pool goes and comes back.
		shared bool
	}{
		{"old pool's scrapes ended", false},
		{"old pool's scrape of a shared server in flight", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			servers := startModelServers(t, 2)
			old, fresh := servers[0], servers[1]
			fresh.servePage(t, vllmpage.State{Running: 1}, vllmpage.Options{})
			arrived, release := make(chan struct{}, 100), make(chan struct{})
			page := mustPage(t, vllmpage.State{Running: 2}, vllmpage.Options{})
			old.set(func(w http.ResponseWriter, r *http.Request) {
				if tc.shared {
					select {
					case arrived <- struct{}{}:
					default:
					}
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
				}
				w.Write(page) //nolint:errcheck
			})
			h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond, Timeout: time.Hour})
			key := types.NamespacedName{Namespace: "tenant-a", Name: "p"}
			upsert := func(key types.NamespacedName, s *modelServer) *datastore.Pool {
				p := h.reg.Upsert(key, &datastore.PoolSpec{Selector: map[string]string{"app": key.Name}, TargetPorts: []int32{int32(s.port)}})
				p.SetPods(pods(nil, s))
				return p
			}
			first := upsert(key, old)
			if tc.shared {
				upsert(types.NamespacedName{Namespace: "tenant-a", Name: "stays"}, old)
				<-arrived
				if got := h.slotsUsed(t, key); got != 1 {
					t.Fatalf("the pool's account holds %v slots with its scrape in flight, want 1", got)
				}
			} else {
				h.awaitSuccess(t, old.addr)
			}

			h.reg.Remove(key)
			second := upsert(key, fresh)
			if second == first {
				t.Fatal("the registry kept the removed pool's object for the pool served again")
			}
			// The old pool's watch delivers once more: the registry drops it.
			first.SetPods(pods(nil, old, fresh))
			h.await(t, "a scrape of the new pool", func(ev scrapeEvent) bool {
				return ev.pool == key && ev.address == fresh.addr && ev.err == nil
			})
			if tc.shared {
				close(release)
				h.await(t, "the shared server's held scrape ending", func(ev scrapeEvent) bool {
					return ev.address == old.addr && ev.err == nil
				})
			}
			// Another round of the new pool's scrapes, all begun after the
			// old pool's ended.
			h.awaitScrapes(t, fresh.addr, 2)

			h.m.mu.Lock()
			ps := h.m.pools[key]
			var addrs []string
			if ps != nil {
				for _, sb := range ps.subs {
					addrs = append(addrs, sb.ep.Address)
				}
			}
			h.m.mu.Unlock()
			if ps == nil || ps.pool != second || len(addrs) != 1 || addrs[0] != fresh.addr {
				t.Fatalf("the scraper holds %v for the pool (the new one: %v), want the new pool's %s alone", addrs, ps != nil && ps.pool == second, fresh.addr)
			}
			// The new pool's next scrape, held, is charged to its exported
			// account.
			held := make(chan struct{}, 100)
			fresh.set(func(w http.ResponseWriter, r *http.Request) {
				select {
				case held <- struct{}{}:
				default:
				}
				<-r.Context().Done()
			})
			<-held
			if got := h.slotsUsed(t, key); got != 1 {
				t.Errorf("the pool served again holds %v slots in its exported account with its scrape in flight, want 1", got)
			}
		})
	}
}

// slotsUsed is the pool's series of the scrape slots' fair share in use,
// -1 when there is none.
func (h *harness) slotsUsed(t *testing.T, key types.NamespacedName) float64 {
	t.Helper()
	fams, err := h.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "poolpicker_fair_share_used" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["limit"] == LimitInFlightScrapes && labels["namespace"] == key.Namespace && labels["pool"] == key.Name {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
