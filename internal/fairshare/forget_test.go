// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package fairshare

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAccountTakenBeforeForget: a holder that took a pool's account before
// the pool was forgotten (a stream that resolved its pool just before the
// pool was deleted) and charges it after the account was dropped charges
// the pool's account of now: one account per pool name, exported, and
// counted once in its namespace, whether or not the pool came back.
func TestAccountTakenBeforeForget(t *testing.T) {
	cases := []struct {
		name string
		// recreate: the pool is served again after the Forget.
		recreate bool
		// held is what a/p's account holds, and guaranteed b/q's
		// guarantee, once the stale holder and the pool of now (if any)
		// each hold 1.
		held, guaranteed int64
	}{
		{"pool gone", false, 1, 45},
		{"pool served again under its name", true, 2, 45},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := New(Options{Name: "streams", Flag: "f", Unit: "streams", Capacity: 100, ReservePercent: 10})
			stale := l.Party("a", "p")
			l.Forget("a", "p")
			if err := stale.Acquire(1); err != nil {
				t.Fatal(err)
			}
			held := stale
			if tc.recreate {
				held = l.Party("a", "p")
				if err := held.Acquire(1); err != nil {
					t.Fatal(err)
				}
			}
			other := l.Party("b", "q")
			if got := held.Held(); got != tc.held {
				t.Errorf("a/p's account holds %d, want %d: the stale holder's charge is on an account of its own", got, tc.held)
			}
			if got := usedSeries(t, l, "a", "p"); got != float64(tc.held) {
				t.Errorf("a/p's used series is %v, want %d", got, tc.held)
			}
			l.mu.Lock()
			nsShare, poolShare := l.sharesLocked(other)
			namespaces := len(l.active)
			l.mu.Unlock()
			if g := min(nsShare, poolShare); g != tc.guaranteed || namespaces != 1 {
				t.Errorf("b/q is guaranteed %d with %d other namespaces active, want %d and 1: namespace a counted twice", g, namespaces, tc.guaranteed)
			}
			stale.Release(1)
			if tc.recreate {
				held.Release(1)
				if got := usedSeries(t, l, "a", "p"); got != 0 {
					t.Errorf("a/p's used series is %v after every release, want 0 (the pool is served)", got)
				}
				return
			}
			if got := usedSeries(t, l, "a", "p"); got != -1 {
				t.Errorf("a/p's used series is %v after the gone pool's last holder let go, want none", got)
			}
		})
	}
}

// usedSeries is the value of the used series of namespace/pool, -1 when
// there is none.
func usedSeries(t *testing.T, l *Limit, namespace, pool string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(l)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "poolpicker_fair_share_used" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["namespace"] == namespace && labels["pool"] == pool {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// TestPartyWhile: a holder that found its pool served takes its account
// without reviving it once the pool was forgotten: the account a gone
// pool's late holder charges is exported while held and goes after.
func TestPartyWhile(t *testing.T) {
	cases := []struct {
		name   string
		served bool
		// before: the pool held an account when it was forgotten, still
		// held by another holder.
		before bool
		// kept: a/p's account is exported once every holder let go.
		kept bool
	}{
		{"pool served", true, false, true},
		{"pool gone, no account", false, false, false},
		{"pool gone, its account still held", false, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := New(Options{Name: "bytes", Flag: "f", Capacity: 100})
			var other *Party
			if tc.before {
				other = l.Party("a", "p")
				if err := other.Acquire(3); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.served {
				l.Forget("a", "p")
			}
			p := l.PartyWhile("a", "p", func() bool { return tc.served })
			if err := p.Acquire(5); err != nil {
				t.Fatal(err)
			}
			want := float64(5)
			if tc.before {
				want = 8
			}
			if got := usedSeries(t, l, "a", "p"); got != want {
				t.Errorf("a/p's used series is %v while held, want %v", got, want)
			}
			p.Release(5)
			if other != nil {
				other.Release(3)
			}
			if got := usedSeries(t, l, "a", "p"); (got >= 0) != tc.kept {
				t.Errorf("a/p's used series is %v once let go; want it kept: %v", got, tc.kept)
			}
		})
	}
}

// TestGoneHandleKeepsNothing: reading a gone pool's handle, or charging it
// past the limit, leaves no account behind.
func TestGoneHandleKeepsNothing(t *testing.T) {
	l := New(Options{Name: "bytes", Flag: "f", Capacity: 10})
	h := l.PartyWhile("a", "p", func() bool { return false })
	if got := h.Held(); got != 0 {
		t.Errorf("a gone pool's handle holds %d, want 0", got)
	}
	if err := h.Acquire(11); err == nil {
		t.Fatal("11 granted of a limit of 10")
	}
	if got := usedSeries(t, l, "a", "p"); got != -1 {
		t.Errorf("a/p's used series is %v after a read and a refusal, want none", got)
	}
}
