// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"fmt"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// TestIndexMemoryBudget: endpoints whose servers report inflated caches,
// fed unique prompts, keep no more blocks than the budget over all pools
// allows, each endpoint no more than its own bound; a pool of another
// namespace that starts recording afterwards still gets its prompts
// remembered; and a removed pool gives its share back.
func TestIndexMemoryBudget(t *testing.T) {
	const budgetBlocks = 20_000
	f := newPrefixFixture(t, 5, fmt.Sprintf(`{"hashBlockSize": 64, "maxIndexBytes": %d, "maxLRUCapacityPerServer": 6000}`, budgetBlocks*indexBytesPerBlock))
	inflated := func() *datastore.Metrics {
		m := schedtest.Load(0, 0.1)
		m.NumBlocks, m.BlockSize = 1<<30, 16 // what a hostile server may report
		return m
	}
	f.tp.SetAll(inflated)
	for i := 0; i < 1000; i++ {
		f.score(schedtest.Prompt(fmt.Sprintf("unique-%d", i), 64*64), 1+i%5)
	}
	if got := f.s.memory.Total(); got > budgetBlocks {
		t.Fatalf("the index charged %d blocks, over its budget of %d", got, budgetBlocks)
	}
	held := f.index().blocks()
	// One pool alone may take all but the 10 % reserve.
	if held > budgetBlocks*9/10 || held < 5000 {
		t.Fatalf("pool A's index holds %d blocks, want at most its share %d (and the endpoints filled)", held, budgetBlocks*9/10)
	}
	for i := 1; i <= 5; i++ {
		if n := f.index().lookup(framework.EndpointKey(f.tp.Ep(t, i).Key())).len(); n > 6000 {
			t.Fatalf("endpoint %d holds %d blocks, over maxLRUCapacityPerServer 6000 whatever its server reports", i, n)
		}
	}

	// Tenant B's pool, recorded after A took its share.
	other := f.tp.Reg.Upsert(datastore.PoolKey{Namespace: "tenant-b", Name: "pool-b"}, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}})
	other.SetPods(f.tp.Pods[:1])
	other.SetSynced(true)
	ep, _ := other.Endpoints().Get(schedtest.PodSource(1).IP + ":8000")
	ep.SetMetrics(schedtest.Load(0, 0.1))
	prompt := schedtest.Prompt("tenant-b", 64*64)
	for range 2 {
		cs := schedtest.NewCycle(other, "m", 1)
		cands := schedtest.Candidates(other)
		f.s.Score(ctx, cs, &framework.Request{Prompt: prompt}, cands, make([]float64, len(cands)))
		f.s.PostPick(ctx, cs, &framework.Request{Prompt: prompt}, &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(ep)}})
	}
	v, _ := f.s.indexes.Load(dsview.Pool(other))
	if n := v.(*prefixIndex).blocks(); n != 64 {
		t.Fatalf("tenant B's pool remembers %d blocks of its 64-block prompt while A holds its share", n)
	}

	f.tp.Reg.Remove(f.tp.Pool.Key)
	if got, b := f.s.memory.Total(), v.(*prefixIndex).share.Held(); got != b {
		t.Fatalf("%d blocks charged once pool A is gone, want only tenant B's %d", got, b)
	}
}
