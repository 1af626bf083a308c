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

// TestBlockLRUAgainstSimpleLRU runs random touches, adds, resizes and ages
// on blockLRU and on golang-lru's simplelru: same blocks, same order, same
// evictions. An age of n is n adds of blocks never seen again in the
// reference (keys from phantomBase up), whose evictions are not reported.
func TestBlockLRUAgainstSimpleLRU(t *testing.T) {
	const phantomBase = 1 << 40
	rnd := rand.New(rand.NewPCG(5, 6))
	var gotEv, wantEv []uint64
	l := newBlockLRU(50, func(h uint64) { gotEv = append(gotEv, h) })
	ref, _ := simplelru.NewLRU[uint64, struct{}](50, func(h uint64, _ struct{}) {
		if h < phantomBase {
			wantEv = append(wantEv, h)
		}
	})
	known := func() []uint64 { // the reference's blocks, most recent first
		var out []uint64
		for _, h := range slices.Backward(ref.Keys()) {
			if h < phantomBase {
				out = append(out, h)
			}
		}
		return out
	}
	next := uint64(phantomBase)
	for op := 0; op < 20000; op++ {
		h := uint64(rnd.IntN(120))
		switch r := rnd.IntN(100); {
		case r < 2:
			c := 1 + rnd.IntN(80)
			l.resize(c)
			ref.Resize(c)
		case r < 6:
			// Ages of up to one and a half capacities, sometimes twice in a row.
			n := rnd.IntN(75)
			l.age(n)
			for range min(n, l.capacity) {
				ref.Add(next, struct{}{})
				next++
			}
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
		if l.len() != len(known()) || l.len()+l.phantomBlocks != ref.Len() || !slices.Equal(gotEv, wantEv) {
			t.Fatalf("op %d: len %d+%d phantom evicted %v, reference %d (%d known) %v", op, l.len(), l.phantomBlocks, gotEv, ref.Len(), len(known()), wantEv)
		}
	}
	if !slices.Equal(l.keys(), known()) {
		t.Fatalf("keys %v, reference %v", l.keys(), known())
	}
}

// TestBlockLRUAge checks what an age of the server's unseen blocks evicts.
func TestBlockLRUAge(t *testing.T) {
	cases := []struct {
		name      string
		held, age int   // blocks added (1..held, the last the most recent), then aged
		ages      []int // more ages after one add of block 100
		want      []uint64
		phantoms  int
	}{
		{"room left: nothing evicted", 3, 2, nil, []uint64{3, 2, 1}, 2},
		{"full: the oldest go", 5, 2, nil, []uint64{5, 4, 3}, 2},
		{"the whole capacity: every block goes", 5, 5, nil, nil, 5},
		{"more than the capacity is the capacity", 5, 50, nil, nil, 5},
		{"nothing", 5, 0, nil, []uint64{5, 4, 3, 2, 1}, 0},
		{"phantoms age out before newer blocks", 3, 2, []int{3}, []uint64{100}, 4},
		{"an add evicts a block older than the phantom", 4, 1, []int{0}, []uint64{100, 4, 3, 2}, 1},
		{"an add takes a unit of an older phantom", 0, 5, []int{0}, []uint64{100}, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var evicted []uint64
			l := newBlockLRU(5, func(h uint64) { evicted = append(evicted, h) })
			for h := 1; h <= c.held; h++ {
				l.add(uint64(h))
			}
			l.age(c.age)
			if c.ages != nil {
				l.add(100)
				for _, n := range c.ages {
					l.age(n)
				}
			}
			if !slices.Equal(l.keys(), c.want) || l.phantomBlocks != c.phantoms {
				t.Fatalf("keys %v phantoms %d, want %v and %d", l.keys(), l.phantomBlocks, c.want, c.phantoms)
			}
			if got := len(l.pos) + l.phantomBlocks; got > l.capacity {
				t.Fatalf("holds %d, capacity %d", got, l.capacity)
			}
			for _, h := range evicted {
				if l.contains(h) {
					t.Fatalf("evicted %d still held", h)
				}
			}
		})
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
			var named []uint64
			dropped := l.dropUsedBefore(stamp, &named)
			if !slices.Equal(l.keys(), c.want) || dropped != len(evicted) || dropped != n-len(c.want) {
				t.Fatalf("kept %v (dropped %d, evicted %v), want %v", l.keys(), dropped, evicted, c.want)
			}
			if !slices.Equal(named, evicted) {
				t.Fatalf("named %v as dropped, evicted %v (the least recent first)", named, evicted)
			}
		})
	}
}

// TestBlockLRURemove: remove evicts the blocks named and only those,
// keeps the others' order, and leaves no trace of a phantom or an absent
// block; a freed position is reused by the next add.
func TestBlockLRURemove(t *testing.T) {
	cases := []struct {
		name   string
		remove []uint64
		want   []uint64 // kept, most recent first
	}{
		{"nothing", nil, []uint64{5, 4, 3, 2, 1}},
		{"the most recent", []uint64{5}, []uint64{4, 3, 2, 1}},
		{"the least recent", []uint64{1}, []uint64{5, 4, 3, 2}},
		{"a middle pair", []uint64{3, 2}, []uint64{5, 4, 1}},
		{"absent blocks", []uint64{42, 0}, []uint64{5, 4, 3, 2, 1}},
		{"all", []uint64{1, 2, 3, 4, 5}, []uint64{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var evicted []uint64
			l := newBlockLRU(10, func(h uint64) { evicted = append(evicted, h) })
			for _, h := range []uint64{1, 2, 3, 4, 5} {
				l.add(h)
			}
			l.age(2) // a phantom entry, the most recent
			var removed []uint64
			for _, h := range c.remove {
				if l.remove(h) {
					removed = append(removed, h)
				}
			}
			if !slices.Equal(l.keys(), c.want) {
				t.Fatalf("kept %v, want %v", l.keys(), c.want)
			}
			if !slices.Equal(evicted, removed) {
				t.Fatalf("evicted %v, removed %v", evicted, removed)
			}
			if l.phantomBlocks != 2 {
				t.Fatalf("phantom blocks %d, want 2", l.phantomBlocks)
			}
			size := len(l.entries)
			l.add(7)
			if len(removed) > 0 && len(l.entries) != size {
				t.Fatalf("entries grew to %d after a removal freed one", len(l.entries))
			}
			if l.keys()[0] != 7 {
				t.Fatalf("keys %v, want 7 the most recent", l.keys())
			}
		})
	}
}

// TestBlockLRUMarkLive: markLive counts the held blocks it marks once
// each, skips those not held, and an eviction or removal of a live block
// takes it off the count; a position reused by an add is not live.
func TestBlockLRUMarkLive(t *testing.T) {
	cases := []struct {
		name string
		mark [][]uint64
		then func(l *blockLRU)
		want int
	}{
		{"nothing marked", nil, nil, 0},
		{"a chain", [][]uint64{{1, 2, 3}}, nil, 3},
		{"marked twice counts once", [][]uint64{{1, 2}, {1, 2}}, nil, 2},
		{"a longer chain after a shorter", [][]uint64{{1, 2}, {1, 2, 3, 4}}, nil, 4},
		{"blocks not held are not counted", [][]uint64{{1, 2, 42}}, nil, 2},
		{"removed", [][]uint64{{1, 2, 3}}, func(l *blockLRU) { l.remove(2) }, 2},
		{"evicted by adds, the positions reused", [][]uint64{{1, 2}}, func(l *blockLRU) {
			for h := uint64(10); h < 15; h++ {
				l.add(h)
			}
		}, 0},
		{"resized", [][]uint64{{4, 5}}, func(l *blockLRU) { l.resize(1) }, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newBlockLRU(5, nil)
			for _, h := range []uint64{1, 2, 3, 4, 5} {
				l.add(h)
			}
			for _, m := range c.mark {
				l.markLive(m)
			}
			if c.then != nil {
				c.then(l)
			}
			live := 0
			for i := l.entries[0].next; i != 0; i = l.entries[i].next {
				if l.entries[i].live {
					live++
				}
			}
			if l.liveBlocks != c.want || live != c.want {
				t.Fatalf("live blocks counted %d, marked %d, want %d", l.liveBlocks, live, c.want)
			}
		})
	}
}
