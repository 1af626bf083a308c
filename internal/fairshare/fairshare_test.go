// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package fairshare

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// step is one call on a party "ns/pool": acquire (n > 0) or release
// (n < 0), and whether an acquire is granted.
type step struct {
	party string
	n     int64
	ok    bool
}

func TestAcquire(t *testing.T) {
	cases := []struct {
		name     string
		capacity int64
		reserve  int
		steps    []step
	}{
		{"a lone pool borrows all but the reserve", 100, 10, []step{
			{"a/p", 90, true}, {"a/p", 1, false}}},
		{"a newcomer gets the reserve while another borrows everything else", 100, 10, []step{
			{"a/p", 90, true}, {"b/q", 10, true}, {"b/q", 1, false}}},
		{"a borrower gives back and cannot take the newcomer's share again", 100, 10, []step{
			{"a/p", 90, true}, {"b/q", 10, true}, {"a/p", -40, true},
			// b's guarantee is 45: it holds 10, so 35 are owed to it, plus
			// the reserve; a, over its own 45, may not borrow into them.
			{"a/p", 1, false}, {"b/q", 35, true}, {"b/q", 1, false}, {"a/p", -10, true}, {"a/p", 5, true}}},
		{"within its guarantee a pool is granted while the limit has room", 100, 10, []step{
			{"a/p", 40, true}, {"b/q", 45, true}, {"a/p", 5, true}, {"a/p", 1, false}}},
		{"a tenant's many pools share its namespace's guarantee", 100, 10, []step{
			{"a/p1", 20, true}, {"a/p2", 20, true}, {"a/p3", 5, true}, {"b/q", 10, true},
			// Namespace a holds 45, its guarantee; b is owed 35 more. p1 is
			// over its pool's 15 and may not borrow; p3, under its own, may
			// have what b is not owed.
			{"a/p1", 1, false}, {"a/p3", 10, true}, {"a/p3", 1, false}, {"b/q", 35, true}, {"b/q", 1, false}}},
		{"a new pool of a namespace holding its guarantee gets the reserve", 100, 10, []step{
			{"a/p", 90, true}, {"a/q", 10, true}, {"a/q", 1, false}, {"b/r", 1, false}}},
		{"pools of one namespace keep each other's guarantee", 100, -1, []step{
			{"a/p1", 60, true}, {"a/p2", 30, true}, {"a/p1", 1, false}, {"a/p2", 10, true}}},
		{"no reserve: a lone pool takes everything", 100, -1, []step{
			{"a/p", 100, true}, {"b/q", 1, false}}},
		{"no limit", 0, 0, []step{{"a/p", 1 << 40, true}, {"b/q", 1 << 40, true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := New(Options{Name: "test", Flag: "test-limit", Unit: "units", Capacity: tc.capacity, ReservePercent: tc.reserve})
			for i, s := range tc.steps {
				ns, pool, _ := strings.Cut(s.party, "/")
				p := l.Party(ns, pool)
				if s.n < 0 {
					p.Release(-s.n)
					continue
				}
				err := p.Acquire(s.n)
				if (err == nil) != s.ok {
					t.Fatalf("step %d %s acquire %d: err %v, want granted %v", i, s.party, s.n, err, s.ok)
				}
				var ex *Exhausted
				if err != nil && (!errors.As(err, &ex) || ex.Pool != pool || !strings.Contains(err.Error(), "--test-limit")) {
					t.Fatalf("step %d: refusal %v does not name the pool and the flag", i, err)
				}
			}
		})
	}
}

// TestUnsharedMovesToItsPool: a charge taken before its pool is known
// counts against the capacity only, and moves to its pool under the pool's
// share.
func TestUnsharedMovesToItsPool(t *testing.T) {
	l := New(Options{Name: "streams", Flag: "max-concurrent-streams", Unit: "streams", Capacity: 10, ReservePercent: 10})
	u, a, b := l.Unshared(), l.Party("a", "p"), l.Party("b", "q")
	for i := 0; i < 10; i++ {
		if !u.AcquireUnshared(1) {
			t.Fatalf("open %d refused", i)
		}
	}
	if u.AcquireUnshared(1) {
		t.Fatal("an 11th stream was admitted over a capacity of 10")
	}
	moved := 0
	for i := 0; i < 10; i++ {
		if u.MoveTo(a, 1) == nil {
			moved++
		}
	}
	if moved != 9 || a.Held() != 9 || u.Held() != 1 {
		t.Fatalf("pool a got %d streams (holds %d, unshared %d), want 9: all but the reserve", moved, a.Held(), u.Held())
	}
	if err := u.MoveTo(b, 1); err != nil {
		t.Fatalf("pool b's first stream refused: %v", err)
	}
}

// TestForget: a forgotten pool's account goes once it is empty, and its
// series with it.
func TestForget(t *testing.T) {
	l := New(Options{Name: "bytes", Flag: "f", Capacity: 100})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(l)
	p := l.Party("a", "p")
	if err := p.Acquire(5); err != nil {
		t.Fatal(err)
	}
	l.Forget("a", "p")
	if n := testutil.CollectAndCount(l, "poolpicker_fair_share_used"); n != 1 {
		t.Fatalf("%d used series while the pool still holds 5, want 1", n)
	}
	p.Release(5)
	if n := testutil.CollectAndCount(l, "poolpicker_fair_share_used"); n != 0 {
		t.Fatalf("%d used series after the forgotten pool let go, want 0", n)
	}
}

// TestConcurrentNeverOverCapacity: many parties acquiring and releasing
// at once never hold more than the capacity together.
func TestConcurrentNeverOverCapacity(t *testing.T) {
	l := New(Options{Name: "bytes", Flag: "f", Capacity: 1000})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		p := l.Party(string(rune('a'+i%3)), string(rune('p'+i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 2000; j++ {
				if p.Acquire(int64(1+j%50)) == nil {
					l.mu.Lock()
					over := l.total > l.capacity
					l.mu.Unlock()
					if over {
						t.Error("the parties hold more than the capacity")
						return
					}
					p.Release(int64(1 + j%50))
				}
			}
		}()
	}
	wg.Wait()
	if l.total != 0 {
		t.Fatalf("%d held after every release", l.total)
	}
}
