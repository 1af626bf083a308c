// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// The process's budget (--prefix-index-max-bytes) bounds every scorer
// instance built under it, the learned index of a precise scorer and its
// KV-event index included, one pool's share at a time: what one instance
// records is charged where another's is, an instance whose maxIndexBytes
// is set keeps a budget of its own, and a pool's event-index blocks are
// refused past its share while another namespace's pool still gets its
// guarantee.
func TestProcessMemoryBudget(t *testing.T) {
	const budgetBlocks = 10_000
	m := NewMemory(budgetBlocks*indexBytesPerBlock, 0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	h := framework.NewHandle(WithMemory(ctx, m), logr.Discard(), reg)
	newScorer := func(name, params string) *Scorer {
		p, err := New(name, json.RawMessage(params), h)
		if err != nil {
			t.Fatal(err)
		}
		return p.(*Scorer)
	}
	a, b := newScorer("a", `{}`), newScorer("b", `{}`)
	own := newScorer("own", fmt.Sprintf(`{"maxIndexBytes": %d}`, 100*indexBytesPerBlock))
	precise, err := NewPrecise("precise", json.RawMessage(`{"kvEventsConfig": {"discoverPods": false, "zmqEndpoint": "tcp://127.0.0.1:1"}}`), h)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		limit bool // shares the process's
		s     *Scorer
	}{{"a", true, a}, {"b", true, b}, {"precise's learned index", true, precise.(*Precise).approx}, {"own", false, own}} {
		if shared := tt.s.memory == m.Limit; shared != tt.limit {
			t.Errorf("instance %s shares the process's budget: %v, want %v", tt.name, shared, tt.limit)
		}
	}

	// What two instances record is charged to the one budget.
	tp := schedtest.NewPool(t, 2)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	for _, s := range []*Scorer{a, b} {
		tp.Reg.AddObserver(schedtest.Observer(s))
		f := &prefixFixture{t: t, tp: tp, s: s}
		before := m.Total()
		f.score(schedtest.Prompt(s.name.Name, 64*64), 1)
		if m.Total() <= before {
			t.Errorf("instance %s recorded a prompt, and the process's budget was charged nothing (%d before, %d after)", s.name.Name, before, m.Total())
		}
	}

	// A pool's KV-event blocks come from its share: a pool alone takes
	// at most the budget, and another namespace's pool still gets its
	// guarantee once the first has taken all it could.
	events := eventBudget{m.Limit}
	greedy := events.ForPool("tenant-a", "a")
	taken := 0
	for greedy.Reserve(1) {
		taken++
		if taken > budgetBlocks {
			t.Fatalf("pool tenant-a/a reserved %d event-index blocks of a budget of %d", taken, budgetBlocks)
		}
	}
	if m.Total() > budgetBlocks {
		t.Fatalf("%d blocks charged, over the budget of %d", m.Total(), budgetBlocks)
	}
	if other := events.ForPool("tenant-b", "b"); !other.Reserve(1) {
		t.Fatalf("tenant-b's pool got no event-index block after tenant-a's took %d: its guarantee is gone", taken)
	}
}
