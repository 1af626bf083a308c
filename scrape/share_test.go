// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

// TestPlanLooksAtBusyPoolsOnly follows the pools a plan looks at as their
// servers become busy and idle again, and as a pool goes.
func TestPlanLooksAtBusyPoolsOnly(t *testing.T) {
	m, reg := unstartedManager(t)
	a := addIPPool(reg, "a", "10.0.0.1", "10.0.0.2")
	b := addIPPool(reg, "b", "10.0.1.1")
	// c shares its server with b: b's busy server is c's too.
	c := addIPPool(reg, "c", "10.0.1.1")
	for i := range 50 {
		addIPPool(reg, fmt.Sprintf("idle-%d", i), fmt.Sprintf("10.1.0.%d", i+1))
	}
	planned := func() []string {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.planLocked(time.Now())
		var names []string
		for _, p := range []*datastore.Pool{a, b, c} {
			if _, ok := m.planned[m.pools[p.Key]]; ok {
				names = append(names, p.Key.Name)
			}
		}
		if n := len(m.planned); n != len(names) {
			t.Errorf("%d pools planned, want only %v", n, names)
		}
		return names
	}
	setBusy := func(p *datastore.Pool, busy bool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, sb := range m.pools[p.Key].subs {
			sb.srv.setBusyLocked(m, busy)
		}
	}
	demand := func(p *datastore.Pool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.demandLocked(p, time.Now())
	}
	for _, step := range []struct {
		name string
		do   func()
		want []string
	}{
		{"none busy", func() {}, nil},
		{"a demanded", func() { demand(a) }, []string{"a"}},
		{"a still busy", func() {}, []string{"a"}},
		{"b's server busy", func() { setBusy(b, true) }, []string{"a", "b", "c"}},
		{"a idle again", func() { setBusy(a, false) }, []string{"b", "c"}},
		{"c gone", func() { reg.Remove(c.Key) }, []string{"b"}},
		{"b idle", func() { setBusy(b, false) }, nil},
		{"a demanded again", func() { demand(a) }, []string{"a"}},
	} {
		step.do()
		if got := planned(); fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Errorf("%s: planned %v, want %v", step.name, got, step.want)
		}
	}
}
