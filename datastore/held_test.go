// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import "testing"

// TestHeldAtOrAbove: the requests flow control holds for an endpoint are
// counted by priority, a request of priority p sees those of p and above,
// and the count is shared by every snapshot of the endpoint.
func TestHeldAtOrAbove(t *testing.T) {
	type add struct {
		priority int
		delta    int64
	}
	for _, tc := range []struct {
		name string
		adds []add
		// want maps a priority asked to the count.
		want map[int]int64
	}{
		{name: "none", want: map[int]int64{-1: 0, 0: 0}},
		{name: "one band", adds: []add{{0, 3}}, want: map[int]int64{-1: 3, 0: 3, 1: 0}},
		{name: "bands", adds: []add{{-1, 5}, {0, 2}, {10, 1}}, want: map[int]int64{-2: 8, -1: 8, 0: 3, 5: 1, 10: 1, 11: 0}},
		{name: "released", adds: []add{{-1, 5}, {0, 2}, {0, -2}, {-1, -1}}, want: map[int]int64{-1: 4, 0: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{8000}})
			p.SetPods([]EndpointSource{src("a", "10.0.0.1")})
			a, _ := p.Endpoints().Get("10.0.0.1:8000")
			for _, x := range tc.adds {
				a.AddHeld(x.priority, x.delta)
			}
			// A later snapshot (another pod joined) shares the counts.
			p.SetPods([]EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.2")})
			a2, _ := p.Endpoints().Get("10.0.0.1:8000")
			for prio, want := range tc.want {
				if got := a2.HeldAtOrAbove(prio); got != want {
					t.Errorf("HeldAtOrAbove(%d) = %d, want %d", prio, got, want)
				}
			}
			if a.InFlight() != 0 {
				t.Errorf("held requests counted in flight: %d", a.InFlight())
			}
		})
	}
}
