// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

func TestBlockLRU(t *testing.T) {
	var evicted []uint64
	l := newBlockLRU(3, func(h uint64) { evicted = append(evicted, h) })
	for _, h := range []uint64{1, 2, 3} {
		l.add(h)
	}
	if !l.touch(1) || l.touch(9) {
		t.Fatal("touch: held 1 not found, or 9 found")
	}
	l.add(4) // evicts 2, the least recent
	if want := []uint64{4, 1, 3}; !slices.Equal(l.keys(), want) || !slices.Equal(evicted, []uint64{2}) {
		t.Fatalf("keys %v evicted %v, want %v and [2]", l.keys(), evicted, want)
	}
	l.resize(1)
	if !slices.Equal(l.keys(), []uint64{4}) || !slices.Equal(evicted, []uint64{2, 3, 1}) || l.len() != 1 {
		t.Fatalf("after resize: keys %v evicted %v", l.keys(), evicted)
	}
	l.resize(0) // at least one
	if l.len() != 1 || !l.contains(4) {
		t.Fatalf("resize 0 left %v", l.keys())
	}
}

// TestBlockLRUAgainstSimpleLRU runs random touches, adds and resizes on
// blockLRU and on golang-lru's simplelru: same blocks, same order, same
// evictions.
func TestBlockLRUAgainstSimpleLRU(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	var gotEv, wantEv []uint64
	l := newBlockLRU(50, func(h uint64) { gotEv = append(gotEv, h) })
	ref, _ := simplelru.NewLRU[uint64, struct{}](50, func(h uint64, _ struct{}) { wantEv = append(wantEv, h) })
	for op := 0; op < 20000; op++ {
		h := uint64(rnd.IntN(120))
		switch r := rnd.IntN(100); {
		case r < 2:
			c := 1 + rnd.IntN(80)
			l.resize(c)
			ref.Resize(c)
		case r < 50:
			_, ok := ref.Get(h)
			if got := l.touch(h); got != ok {
				t.Fatalf("op %d: touch(%d) = %v, reference %v", op, h, got, ok)
			}
		default:
			if _, ok := ref.Get(h); ok {
				l.touch(h)
				continue
			}
			ref.Add(h, struct{}{})
			l.add(h)
		}
		if l.len() != ref.Len() || !slices.Equal(gotEv, wantEv) {
			t.Fatalf("op %d: len %d evicted %v, reference %d %v", op, l.len(), gotEv, ref.Len(), wantEv)
		}
	}
	want := ref.Keys() // oldest first
	slices.Reverse(want)
	if !slices.Equal(l.keys(), want) {
		t.Fatalf("keys %v, reference %v", l.keys(), want)
	}
}

// TestBlockLRUForgetsUsedBefore checks the stamps that order the blocks by
// recency, through touches, adds and a run moved to the front, and that
// dropUsedBefore evicts exactly the blocks used before a given one.
func TestBlockLRUForgetsUsedBefore(t *testing.T) {
	cases := []struct {
		name   string
		before uint64 // drop the blocks used before this one
		want   []uint64
	}{
		{"the least recent drops nothing", 1, []uint64{5, 4, 3, 2, 1}},
		{"a middle block drops the older ones", 3, []uint64{5, 4, 3}},
		{"the most recent keeps only itself", 5, []uint64{5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var evicted []uint64
			l := newBlockLRU(10, func(h uint64) { evicted = append(evicted, h) })
			for _, h := range []uint64{9, 1, 2, 3, 4, 5} {
				l.add(h)
			}
			l.touch(9)
			// 1..5 as a run to the front, in order 5 (most recent) to 1.
			n, first, last := 0, int32(0), int32(0)
			for i := l.entries[0].next; i != 0; i = l.entries[i].next {
				if l.entries[i].key == 5 {
					first = i
				}
				if l.entries[i].key == 1 {
					last = i
				}
				n++
			}
			l.moveRunToFront(first, last)
			if !slices.Equal(l.keys(), []uint64{5, 4, 3, 2, 1, 9}) {
				t.Fatalf("keys %v", l.keys())
			}
			var prev uint64
			for i := l.entries[0].prev; i != 0; i = l.entries[i].prev {
				if l.entries[i].stamp <= prev {
					t.Fatalf("stamps do not rise toward the head: %d after %d", l.entries[i].stamp, prev)
				}
				prev = l.entries[i].stamp
			}
			stamp, ok := l.stampOf(c.before)
			if !ok {
				t.Fatal("stampOf: held block not found")
			}
			if _, ok := l.stampOf(42); ok {
				t.Fatal("stampOf: 42 found")
			}
			dropped := l.dropUsedBefore(stamp)
			if !slices.Equal(l.keys(), c.want) || dropped != len(evicted) || dropped != n-len(c.want) {
				t.Fatalf("kept %v (dropped %d, evicted %v), want %v", l.keys(), dropped, evicted, c.want)
			}
		})
	}
}
