package scheduling

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
