// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// No connection outlives its endpoint's scrape, and a server whose
// endpoints stay keeps the one connection it has: after each change to a
// pool, its endpoints or their pods, the model server holds exactly the
// connections the servers still scraped need (counted by the server
// itself), and a change that leaves the scrape where it was opens none.
func TestConnectionsFollowEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer)
		// open is the connections the server holds once the change has
		// settled; redial is set when the change may open one anew.
		open   int64
		redial bool
	}{
		{name: "pods listed again, the same", open: 1, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			for range 5 {
				p.SetPods(pods(nil, ms))
			}
		}},
		{name: "pod relabelled", open: 1, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			p.SetPods(pods(map[string]string{"version": "2"}, ms))
		}},
		{name: "pool spec written again", open: 1, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			h.reg.Upsert(p.Key, &datastore.PoolSpec{Selector: map[string]string{"app": "pool"}, TargetPorts: []int32{int32(ms.port)}})
		}},
		{name: "pool's endpoints gone for a while", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			p.SetPods(nil)
			p.SetPods(pods(nil, ms))
		}},
		{name: "endpoint removed", open: 0, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			p.SetPods(nil)
		}},
		{name: "endpoint removed mid-scrape", open: 0, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			<-ms.block()
			p.SetPods(nil)
		}},
		{name: "pool removed", open: 0, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			h.reg.Remove(p.Key)
		}},
		{name: "pool removed and back", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			h.reg.Remove(p.Key)
			h.addPool("pool", nil, ms.port, ms)
		}},
		{name: "pod replaced at the same address", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			p.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "ns", Name: "pod-2"}, UID: "uid-2", IP: ms.ip}})
		}},
		{name: "engine label changed", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			p.SetPods(pods(map[string]string{LabelModelServerEngine: "sglang"}, ms))
		}},
		{name: "metrics path changed", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			h.reg.Upsert(p.Key, &datastore.PoolSpec{Selector: map[string]string{"app": "pool"}, TargetPorts: []int32{int32(ms.port)},
				Annotations: map[string]string{AnnotationMetricsPath: "/other"}})
		}},
		{name: "address taken by a pool of another namespace", open: 1, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			other := h.reg.Upsert(types.NamespacedName{Namespace: "other", Name: "pool"}, &datastore.PoolSpec{
				Selector: map[string]string{"app": "pool"}, TargetPorts: []int32{int32(ms.port)}})
			other.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "other", Name: "pod"}, UID: "uid-other", IP: ms.ip}})
			p.SetPods(nil)
		}},
		{name: "scrape timed out", open: 1, redial: true, change: func(t *testing.T, h *harness, p *datastore.Pool, ms *modelServer) {
			ms.set(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
			h.awaitError(t, ms.addr, "timeout")
			ms.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startModelServers(t, 1)[0]
			ms.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
			h := newHarness(t, Options{RefreshInterval: 5 * time.Millisecond, Timeout: 200 * time.Millisecond})
			p := h.addPool("pool", nil, ms.port, ms)
			h.awaitScrapes(t, ms.addr, 3)
			if n := ms.accepted.Load(); n != 1 {
				t.Fatalf("%d connections for the first scrapes, want 1", n)
			}
			tc.change(t, h, p, ms)
			before := ms.requests.Load()
			if tc.open > 0 {
				// Enough scrapes after the change that one on a
				// connection opened anew has been made.
				poll.Until(t, 10*time.Second, "scrapes after the change", func() bool { return ms.requests.Load() >= before+5 })
			}
			poll.Until(t, 10*time.Second, fmt.Sprintf("%d connections open", tc.open), func() bool { return ms.open.Load() == tc.open })
			if !tc.redial {
				if n := ms.accepted.Load(); n != 1 {
					t.Errorf("%d connections opened, want the first kept", n)
				}
			}
			h.m.mu.Lock()
			servers := len(h.m.servers)
			h.m.mu.Unlock()
			if want := int(tc.open); servers != want {
				t.Errorf("the manager holds %d servers, want %d", servers, want)
			}
		})
	}
}
