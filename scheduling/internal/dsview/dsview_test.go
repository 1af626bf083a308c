// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package dsview_test

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
)

// TestViews: the views read a real registry's pool, endpoints and scrape,
// views of one object are ==, and handing them out allocates nothing.
func TestViews(t *testing.T) {
	reg := datastore.NewRegistry()
	key := types.NamespacedName{Namespace: "ns", Name: "pool"}
	p := reg.Upsert(key, &datastore.PoolSpec{TargetPorts: []int32{8000, 8001}, Annotations: map[string]string{"a": "b"}})
	p.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "ns", Name: "pod"}, UID: "uid-1", IP: "127.0.2.1", Labels: map[string]string{"app": "m"}}})
	p.SetSynced(true)
	e := p.Endpoints().Endpoints[1]
	scrape := &datastore.Metrics{WaitingRequests: 3, RunningRequests: 4, KVCacheUsage: 0.5, RunningAdapters: []string{"x"}, WaitingAdapters: []string{"y"},
		MaxAdapters: 2, BlockSize: 16, NumBlocks: 100, PrefixCacheQueries: 7, PrefixCacheHits: 5, ScrapedAt: time.Unix(10, 0), Interval: time.Second}
	e.SetMetrics(scrape)
	e.AddInFlight(2)

	pool := dsview.Pool(p)
	if pool != dsview.Pool(p) || pool.Key() != key || pool.Annotations()["a"] != "b" || !pool.Synced() || pool.Removed() {
		t.Fatalf("pool view: key %v, annotations %v, synced %v, removed %v", pool.Key(), pool.Annotations(), pool.Synced(), pool.Removed())
	}
	set := pool.Endpoints()
	if set != pool.Endpoints() || set.Len() != 2 {
		t.Fatalf("endpoint set view: %d endpoints, == another view of it: %v", set.Len(), set == pool.Endpoints())
	}
	ep := dsview.Endpoint(e)
	if got, ok := set.Get("127.0.2.1:8001"); !ok || got != ep || set.At(1) != ep {
		t.Fatalf("Get and At: %v %v, want the view of %s", got, ok, e.Address)
	}
	if _, ok := set.Get("127.0.2.1:9"); ok {
		t.Fatal("Get found an address not in the set")
	}
	if ep.Address() != e.Address || ep.IP() != e.IP || ep.Port() != 8001 || ep.Pod() != e.Pod || ep.PodUID() != "uid-1" ||
		ep.Labels()["app"] != "m" || ep.Key() != (framework.EndpointKey{UID: "uid-1", Port: 8001}) || ep.InFlight() != 2 {
		t.Fatalf("endpoint view %s %s %d %v %s %v %v %d", ep.Address(), ep.IP(), ep.Port(), ep.Pod(), ep.PodUID(), ep.Labels(), ep.Key(), ep.InFlight())
	}
	m := ep.Metrics()
	running, waiting := m.HasAdapter("x")
	if m != dsview.Metrics(scrape) || m.WaitingRequests() != 3 || m.RunningRequests() != 4 || m.KVCacheUsage() != 0.5 || !running || waiting ||
		m.MaxAdapters() != 2 || m.BlockSize() != 16 || m.NumBlocks() != 100 || m.PrefixCacheQueries() != 7 || m.PrefixCacheHits() != 5 ||
		!m.ScrapedAt().Equal(time.Unix(10, 0)) || m.Interval() != time.Second || m.WaitingAdapter(0) != "y" {
		t.Fatalf("metrics view does not read the scrape %+v", scrape)
	}
	if !dsview.Metrics(nil).IsZero() || dsview.Pool(nil) != nil || dsview.Endpoint(nil) != nil || dsview.Endpoints(nil) != nil {
		t.Fatal("the view of nothing is not the zero view")
	}
	if got := dsview.Endpoints(p.Endpoints().Endpoints); !slices.Equal(got, []framework.Endpoint{set.At(0), ep}) {
		t.Fatalf("Endpoints %v", got)
	}
	var sink int64
	if n := testing.AllocsPerRun(100, func() {
		v := dsview.Endpoint(e)
		sink += v.InFlight() + int64(v.Metrics().WaitingRequests()) + int64(dsview.Pool(p).Endpoints().Len())
	}); n != 0 {
		t.Fatalf("handing out views allocates %v times", n)
	}
	reg.Remove(key)
	if !pool.Removed() {
		t.Fatal("the view of a removed pool is not Removed")
	}
}
