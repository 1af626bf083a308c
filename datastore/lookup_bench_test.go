// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"fmt"
	"testing"
)

// lookupRegistry is 1,000 pools of 10 pods each, every pool behind one of 10
// picker Services.
func lookupRegistry(tb testing.TB) (*Registry, PoolKey, string) {
	tb.Helper()
	r := NewRegistry()
	for i := range 1000 {
		key := PoolKey{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("pool%d", i)}
		p := r.Upsert(key, &PoolSpec{TargetPorts: []int32{8000}, PickerService: fmt.Sprintf("epp%d", i%10), PickerPort: 9002})
		var pods []EndpointSource
		for j := range 10 {
			pods = append(pods, src(fmt.Sprintf("p%d-%d", i, j), fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1)))
		}
		p.SetPods(pods)
	}
	return r, PoolKey{Namespace: "ns7", Name: "pool537"}, "10.2.37.5:8000"
}

// TestLookupsAllocateNothing holds the request-path lookups to zero
// allocations.
func TestLookupsAllocateNothing(t *testing.T) {
	r, key, addr := lookupRegistry(t)
	p, _ := r.Get(key)
	cases := []struct {
		name string
		f    func()
	}{
		{"Registry.Get", func() { _, _ = r.Get(key) }},
		{"Registry.ByPicker", func() { _ = r.ByPicker("ns7", "epp7", 9002) }},
		{"Registry.ByPicker any port", func() { _ = r.ByPicker("ns7", "epp7", 0) }},
		{"Registry.ByEndpoint", func() { _ = r.ByEndpoint(addr) }},
		{"Pool.Endpoints", func() { _ = p.Endpoints().Len() }},
		{"EndpointSet.Get", func() { _, _ = p.Endpoints().Get(addr) }},
		{"Pool.Spec and Policy", func() { _, _ = p.Spec(), p.Policy() }},
	}
	for _, tc := range cases {
		if n := testing.AllocsPerRun(1000, tc.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tc.name, n)
		}
	}
	if len(r.ByEndpoint(addr)) != 1 || len(r.ByPicker("ns7", "epp7", 9002)) != 100 {
		t.Fatalf("lookups found ByEndpoint %d, ByPicker %d pools", len(r.ByEndpoint(addr)), len(r.ByPicker("ns7", "epp7", 9002)))
	}
}

func BenchmarkRegistryGet(b *testing.B) {
	r, key, _ := lookupRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := r.Get(key); !ok {
				b.Fatal("missing")
			}
		}
	})
}

func BenchmarkByPicker(b *testing.B) {
	r, _, _ := lookupRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if len(r.ByPicker("ns7", "epp7", 9002)) == 0 {
				b.Fatal("missing")
			}
		}
	})
}

func BenchmarkByEndpoint(b *testing.B) {
	r, _, addr := lookupRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if len(r.ByEndpoint(addr)) == 0 {
				b.Fatal("missing")
			}
		}
	})
}

func BenchmarkPoolEndpoints(b *testing.B) {
	r, key, addr := lookupRegistry(b)
	p, _ := r.Get(key)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := p.Endpoints().Get(addr); !ok {
				b.Fatal("missing")
			}
		}
	})
}

// BenchmarkSetPods is the writer side: a 100-pod pool's set rebuilt and swapped.
func BenchmarkSetPods(b *testing.B) {
	r := NewRegistry()
	p := r.Upsert(PoolKey{Namespace: "ns", Name: "p"}, &PoolSpec{TargetPorts: []int32{8000}})
	var pods []EndpointSource
	for j := range 100 {
		pods = append(pods, src(fmt.Sprintf("p%d", j), fmt.Sprintf("10.0.0.%d", j+1)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.SetPods(pods)
	}
}

// BenchmarkUpsertPools is a start's pool additions, one by one, each pool
// behind its own picker Service (a Service per pool, as a shared picker
// provisions them): the view is copy-on-write, so what each addition
// copies decides whether a start is linear in the pools or quadratic.
func BenchmarkUpsertPools(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		keys := make([]PoolKey, n)
		specs := make([]*PoolSpec, n)
		for i := range n {
			keys[i] = PoolKey{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("pool%d", i)}
			specs[i] = &PoolSpec{TargetPorts: []int32{8000}, PickerService: fmt.Sprintf("epp-pool%d", i), PickerPort: 9002}
		}
		b.Run(fmt.Sprintf("pools=%d", n), func(b *testing.B) {
			for b.Loop() {
				r := NewRegistry()
				for i := range n {
					r.Upsert(keys[i], specs[i])
				}
			}
		})
	}
}
