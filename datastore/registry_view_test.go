// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestViewIndexesAsPoolsComeAndGo checks the view a start builds pool by
// pool (without re-sorting) against the pools it holds: every pool listed
// once in key order, and each picker's pools exactly those naming it, in
// key order, through additions, picker changes and removals.
func TestViewIndexesAsPoolsComeAndGo(t *testing.T) {
	r := NewRegistry()
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[PoolKey]*PoolSpec{}
	check := func(step string) {
		t.Helper()
		var keys []PoolKey
		for k := range live {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b PoolKey) int { return comparePools(&Pool{Key: a}, &Pool{Key: b}) })
		var got []PoolKey
		for _, p := range r.Pools() {
			got = append(got, p.Key)
		}
		if !slices.Equal(got, keys) {
			t.Fatalf("%s: Pools() = %v, want %v", step, got, keys)
		}
		for _, ns := range []string{"a", "b", "c"} {
			for _, svc := range []string{"epp", "other"} {
				for _, port := range []int32{0, 9002, 9003} {
					var want []PoolKey
					for _, k := range keys {
						if s := live[k]; k.Namespace == ns && s.PickerService == svc && (port == 0 || s.PickerPort == port) {
							want = append(want, k)
						}
					}
					var got []PoolKey
					for _, p := range r.ByPicker(ns, svc, port) {
						got = append(got, p.Key)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("%s: ByPicker(%s, %s, %d) = %v, want %v", step, ns, svc, port, got, want)
					}
				}
			}
		}
	}
	for i := range 300 {
		key := PoolKey{Namespace: []string{"a", "b", "c"}[rng.IntN(3)], Name: fmt.Sprintf("pool-%d", rng.IntN(120))}
		step := fmt.Sprintf("step %d", i)
		switch op := rng.IntN(10); {
		case op < 7:
			spec := &PoolSpec{Selector: map[string]string{"app": key.Name}, TargetPorts: []int32{8000}}
			if rng.IntN(4) > 0 {
				spec.PickerService, spec.PickerPort = []string{"epp", "other"}[rng.IntN(2)], []int32{9002, 9003}[rng.IntN(2)]
			}
			r.Upsert(key, spec)
			live[key] = spec
			step += " upsert " + key.String()
		default:
			r.Remove(key)
			delete(live, key)
			step += " remove " + key.String()
		}
		check(step)
	}
	if r.Len() != len(live) {
		t.Fatalf("Len() = %d, want %d", r.Len(), len(live))
	}
}
