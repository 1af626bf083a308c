// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"strings"
	"testing"
)

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

// loadLog records what the load observers hear: the endpoint and its own
// count at the time.
type loadLog []string

func (l *loadLog) InFlightChanged(_ *Pool, e *Endpoint) {
	*l = append(*l, e.Address+"="+string(rune('0'+e.OwnInFlight())))
}

// TestLease: a lease counts its request where it is, moves the count whole,
// gives it back once however often it is released, names the endpoint it
// counted on last after its release, and every change is heard by the load
// observers with the count already changed.
func TestLease(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps: "move" to b, "move-same" to a, "release".
		steps []string
		wantA int64
		wantB int64
		// wantEndpoint is the endpoint Endpoint names after the steps (the
		// last counted on, once released): "a" or "b".
		wantEndpoint string
		wantLog      string
	}{
		{name: "acquired", wantA: 1, wantEndpoint: "a", wantLog: "10.0.0.1:8000=1"},
		{name: "released", steps: []string{"release"}, wantEndpoint: "a", wantLog: "10.0.0.1:8000=1 10.0.0.1:8000=0"},
		{name: "released twice", steps: []string{"release", "release"}, wantEndpoint: "a", wantLog: "10.0.0.1:8000=1 10.0.0.1:8000=0"},
		{name: "moved", steps: []string{"move"}, wantB: 1, wantEndpoint: "b", wantLog: "10.0.0.1:8000=1 10.0.0.2:8000=1 10.0.0.1:8000=0"},
		{name: "moved where it is", steps: []string{"move-same"}, wantA: 1, wantEndpoint: "a", wantLog: "10.0.0.1:8000=1"},
		{name: "moved then released", steps: []string{"move", "release", "release"}, wantEndpoint: "b", wantLog: "10.0.0.1:8000=1 10.0.0.2:8000=1 10.0.0.1:8000=0 10.0.0.2:8000=0"},
		{name: "released then moved", steps: []string{"release", "move"}, wantEndpoint: "a", wantLog: "10.0.0.1:8000=1 10.0.0.1:8000=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			var log loadLog
			r.AddLoadObserver(&log)
			p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{8000}})
			p.SetPods([]EndpointSource{src("a", "10.0.0.1"), src("b", "10.0.0.2")})
			a, _ := p.Endpoints().Get("10.0.0.1:8000")
			b, _ := p.Endpoints().Get("10.0.0.2:8000")
			l := p.Acquire(a)
			for _, s := range tc.steps {
				switch s {
				case "move":
					l.Move(b)
				case "move-same":
					l.Move(a)
				case "release":
					l.Release()
				}
			}
			if a.InFlight() != tc.wantA || b.InFlight() != tc.wantB {
				t.Errorf("in flight a=%d b=%d, want %d %d", a.InFlight(), b.InFlight(), tc.wantA, tc.wantB)
			}
			if want := map[string]*Endpoint{"a": a, "b": b}[tc.wantEndpoint]; l.Endpoint() != want {
				t.Errorf("lease's endpoint %v, want %s", l.Endpoint(), want.Address)
			}
			if got := strings.Join(log, " "); got != tc.wantLog {
				t.Errorf("observers heard %q, want %q", got, tc.wantLog)
			}
		})
	}
	var nilLease *Lease
	nilLease.Release() // a request never committed has none
	if nilLease.Endpoint() != nil {
		t.Fatal("a nil lease counts somewhere")
	}
}

// TestHold: a hold counts one request of its priority until released, once.
func TestHold(t *testing.T) {
	p := NewRegistry().Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{8000}})
	p.SetPods([]EndpointSource{src("a", "10.0.0.1")})
	a, _ := p.Endpoints().Get("10.0.0.1:8000")
	low, high := a.Hold(-1), a.Hold(5)
	if got := a.HeldAtOrAbove(0); got != 1 {
		t.Fatalf("held at or above 0: %d, want 1", got)
	}
	high.Release()
	high.Release()
	if got := a.HeldAtOrAbove(-1); got != 1 {
		t.Fatalf("after releasing the high hold twice: %d held, want 1", got)
	}
	low.Release()
	var none *Hold
	none.Release()
	if got := a.HeldAtOrAbove(-10); got != 0 {
		t.Fatalf("after every release: %d held", got)
	}
}
