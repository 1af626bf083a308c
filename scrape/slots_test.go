// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// The scrape slots are shared fairly between namespaces: a tenant whose
// pool's servers all hang until the timeout, allowed by its per-pool bound
// every slot, borrows all it can but the reserve, so another tenant's pool
// that turns up afterwards is scraped at once and keeps being scraped.
func TestScrapeSlotsSharedBetweenTenants(t *testing.T) {
	const (
		slots   = 20
		reserve = 2 // fairshare's default 10 %
	)
	servers := startModelServers(t, 2*slots+2)
	hanging, healthy := servers[:2*slots], servers[2*slots:]
	for _, s := range hanging {
		s.set(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	}
	for _, s := range healthy {
		s.servePage(t, vllmpage.State{Running: 2}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond, Timeout: time.Hour, MaxConcurrentScrapes: slots, MaxConcurrentScrapesPerPool: slots})
	upsert := func(ns, name string, port int, ss ...*modelServer) {
		p := h.reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
			Selector: map[string]string{"app": name}, TargetPorts: []int32{int32(port)},
		})
		p.SetPods(pods(nil, ss...))
	}
	upsert("tenant-a", "a", hanging[0].port, hanging...)
	// Tenant A borrows everything but the reserve.
	poll.Until(t, time.Minute, "tenant A's scrapes holding its slots", func() bool {
		return h.m.share.Total() == slots-reserve
	})
	upsert("tenant-b", "b", healthy[0].port, healthy...)
	for _, s := range healthy {
		h.awaitScrapes(t, s.addr, 20)
	}
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	held := int64(0)
	for key, ps := range h.m.pools {
		if key.Namespace == "tenant-a" {
			held += ps.slots.Held()
		}
	}
	if held > slots-reserve {
		t.Errorf("tenant A holds %d of the %d slots, into the reserve of %d", held, slots, reserve)
	}
}
