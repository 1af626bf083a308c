// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"slices"
	"testing"
	"time"
)

// TestEndpointApply: the index keys blocks from their tokens whatever the
// server's hashes are, roots a LoRA adapter's blocks at the adapter, keeps
// tiers apart and drops what it cannot chain.
func TestEndpointApply(t *testing.T) {
	h, _ := NewHasher(2, "s", "")
	tokens := []uint32{1, 2, 3, 4, 5, 6}
	base := h.Keys(nil, h.Root("m"), tokens)
	lora := h.Keys(nil, h.Root("ad"), tokens)
	var dropped map[string]int
	newEP := func() *Endpoint {
		dropped = map[string]int{}
		ep := newEndpoint(h, 0, nil, func(r string, n int) { dropped[r] += n })
		ep.reset(true)
		return ep
	}
	stored := func(hashes []uint64, parent uint64, toks []uint32, lora, medium string) Event {
		return Event{Kind: BlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0, Tokens: toks, BlockSize: 2, LoRAName: lora, Medium: medium}
	}
	tests := []struct {
		name        string
		events      []Event
		keys        []uint64
		want        int
		wantBlocks  int
		wantDropped string
	}{
		{name: "server hashes of its own (vLLM's sha256), chained by parent",
			events: []Event{stored([]uint64{901, 902}, 0, tokens[:4], "", "GPU"), stored([]uint64{903}, 902, tokens[4:], "", "GPU")},
			keys:   base, want: 3, wantBlocks: 3},
		{name: "a LoRA adapter's blocks are rooted at the adapter",
			events: []Event{stored([]uint64{1, 2, 3}, 0, tokens, "ad", "")},
			keys:   lora, want: 3, wantBlocks: 3},
		{name: "the base model's prompt does not match the adapter's blocks",
			events: []Event{stored([]uint64{1, 2, 3}, 0, tokens, "ad", "")},
			keys:   base, want: 0, wantBlocks: 3},
		{name: "removal from one tier keeps the other",
			events: []Event{stored([]uint64{7, 8, 9}, 0, tokens, "", "GPU"), {Kind: BlockStored, BlockHashes: []uint64{7}, Medium: "CPU"},
				{Kind: BlockRemoved, BlockHashes: []uint64{7, 8}, Medium: "GPU"}},
			keys: base, want: 1, wantBlocks: 2},
		{name: "an unknown parent cannot be chained",
			events: []Event{stored([]uint64{5}, 4, tokens[:2], "", "")},
			keys:   base, want: 0, wantBlocks: 0, wantDropped: DropUnknownParent},
		{name: "blocks of another size do not match the prompt's",
			events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4}},
			keys:   base, want: 0, wantBlocks: 0, wantDropped: DropBlocks},
		{name: "all blocks cleared",
			events: []Event{stored([]uint64{1, 2, 3}, 0, tokens, "", ""), {Kind: AllBlocksCleared}},
			keys:   base, want: 0, wantBlocks: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := newEP()
			ep.apply("m", &Batch{Events: tt.events})
			n, ok := ep.Match(tt.keys)
			if !ok || n != tt.want {
				t.Errorf("Match = %d, %v; want %d", n, ok, tt.want)
			}
			if got := ep.Blocks(); got != tt.wantBlocks {
				t.Errorf("Blocks = %d, want %d", got, tt.wantBlocks)
			}
			if tt.wantDropped != "" && dropped[tt.wantDropped] == 0 {
				t.Errorf("nothing dropped for %s: %v", tt.wantDropped, dropped)
			}
		})
	}
	// A cleared cache confirms an index that was not.
	ep := newEP()
	ep.reset(false)
	if _, ok := ep.Match(base); ok {
		t.Fatal("an unconfirmed index answered")
	}
	ep.apply("m", &Batch{Events: []Event{{Kind: AllBlocksCleared}}})
	if !ep.Confirmed() {
		t.Error("AllBlocksCleared did not confirm the index")
	}
}

// TestEndpointRemovedSince: the blocks a pick found and the server removed
// after it are told apart from those it kept, whether it stored them again
// since (a queued request's prefill recomputing its evicted prefix) or not,
// and a block held in another tier is still held.
func TestEndpointRemovedSince(t *testing.T) {
	h, _ := NewHasher(2, "s", "")
	tokens := []uint32{1, 2, 3, 4, 5, 6}
	keys := h.Keys(nil, h.Root("m"), tokens)
	stored := Event{Kind: BlockStored, BlockHashes: []uint64{1, 2, 3}, Tokens: tokens, BlockSize: 2, Medium: "GPU"}
	tests := []struct {
		name  string
		after []Event // the batches applied after the pick, one event each
		want  int
	}{
		{"nothing happened", nil, 0},
		{"another prompt's blocks stored", []Event{{Kind: BlockStored, BlockHashes: []uint64{9}, Tokens: []uint32{7, 8}, BlockSize: 2}}, 0},
		{"the tail evicted", []Event{{Kind: BlockRemoved, BlockHashes: []uint64{3}, Medium: "GPU"}}, 1},
		{"evicted and stored again by the prefill", []Event{{Kind: BlockRemoved, BlockHashes: []uint64{1, 2, 3}, Medium: "GPU"}, stored}, 3},
		{"stored again while held: not removed", []Event{stored}, 0},
		{"offloaded to CPU, then evicted from the GPU", []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, Medium: "CPU"}, {Kind: BlockRemoved, BlockHashes: []uint64{1, 2}, Medium: "GPU"}}, 1},
		{"the cache cleared", []Event{{Kind: AllBlocksCleared}}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := newEndpoint(h, 0, nil, func(string, int) {})
			ep.reset(true)
			ep.apply("m", &Batch{Events: []Event{stored}})
			mark := ep.Epoch()
			for _, ev := range tt.after {
				ep.apply("m", &Batch{Events: []Event{ev}})
			}
			if got := ep.RemovedSince(keys, mark); got != tt.want {
				t.Errorf("RemovedSince = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestEndpointExpectStored: the blocks of a prompt sent to a server count
// until its events store them or their deadline passes; a block the
// events stored and then removed is not brought back, one the server held
// when the prompt was sent is not recorded, a cleared cache drops them,
// the set stops growing at its bound or a full budget until its keys
// expire, and every key's reservation is released when it leaves.
func TestEndpointExpectStored(t *testing.T) {
	h, _ := NewHasher(2, "s", "")
	tokens := []uint32{1, 2, 3, 4, 5, 6}
	keys := h.Keys(nil, h.Root("m"), tokens)
	storedFirst := Event{Kind: BlockStored, BlockHashes: []uint64{1, 2}, Tokens: tokens[:4], BlockSize: 2}
	removedFirst := Event{Kind: BlockRemoved, BlockHashes: []uint64{1, 2}}
	now := time.Unix(1000, 0)
	const ttl = 2 * time.Second
	tests := []struct {
		name      string
		before    []Event // applied before the prompt is sent
		after     []Event // applied after
		maxBlocks int
		budget    int           // blocks the budget allows; 0: any
		at        time.Duration // after the send
		want      int
		wantHeld  int
		// wantExpected is ExpectedBlocks before the deadline.
		wantExpected int
	}{
		{name: "sent, not yet stored", want: 3, wantExpected: 3},
		{name: "past the deadline", at: ttl, want: 0},
		{name: "partly stored, the rest still expected", after: []Event{storedFirst}, want: 3, wantHeld: 2, wantExpected: 1},
		{name: "stored, then evicted: not brought back", after: []Event{storedFirst, removedFirst}, want: 0, wantExpected: 1},
		{name: "held when sent, evicted since: not expected", before: []Event{storedFirst}, after: []Event{removedFirst}, want: 0, wantExpected: 1},
		{name: "the cache cleared", after: []Event{{Kind: AllBlocksCleared}}, want: 0},
		{name: "a bound of two keys", maxBlocks: 2, want: 2, wantExpected: 2},
		{name: "a budget of one block", budget: 1, want: 1, wantExpected: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			budget := &countingBudget{t: t, limit: tt.budget}
			ep := newEndpoint(h, tt.maxBlocks, budget, func(string, int) {})
			ep.reset(true)
			ep.apply("m", &Batch{Events: tt.before})
			ep.ExpectStored(keys, now, ttl)
			for _, ev := range tt.after {
				ep.apply("m", &Batch{Events: []Event{ev}})
			}
			if n, ok := ep.MatchExpected(keys, now.Add(tt.at)); !ok || n != tt.want {
				t.Errorf("MatchExpected = %d, %v; want %d", n, ok, tt.want)
			}
			if n, _ := ep.Match(keys); n != tt.wantHeld {
				t.Errorf("Match = %d, want %d: expected blocks are not held", n, tt.wantHeld)
			}
			if tt.at == 0 && ep.ExpectedBlocks() != tt.wantExpected {
				t.Errorf("ExpectedBlocks = %d, want %d", ep.ExpectedBlocks(), tt.wantExpected)
			}
			ep.reset(true)
			if budget.n != 0 {
				t.Errorf("%d blocks still reserved after the index was cleared", budget.n)
			}
		})
	}

	// A full set takes new keys once its own have expired and been swept,
	// and the swept keys' reservations are released.
	budget := &countingBudget{t: t}
	ep := newEndpoint(h, 2, budget, func(string, int) {})
	ep.reset(true)
	other := h.Keys(nil, h.Root("other"), tokens)
	ep.ExpectStored(keys, now, ttl)
	ep.ExpectStored(other, now.Add(time.Second), ttl)
	if n, _ := ep.MatchExpected(other, now.Add(time.Second)); n != 0 || ep.ExpectedBlocks() != 2 {
		t.Errorf("a full set recorded %d more keys, holds %d", n, ep.ExpectedBlocks())
	}
	ep.ExpectStored(other, now.Add(ttl), ttl)
	if n, _ := ep.MatchExpected(other, now.Add(ttl)); n != 2 || ep.ExpectedBlocks() != 2 || budget.n != 2 {
		t.Errorf("after its keys expired the set took %d keys (holds %d, %d reserved), want 2", n, ep.ExpectedBlocks(), budget.n)
	}
	ep.reset(false)
	if _, ok := ep.MatchExpected(keys, now); ok {
		t.Error("an unconfirmed index answered")
	}
}

// countingBudget counts the blocks reserved, up to limit when it is set.
type countingBudget struct {
	t        *testing.T
	n, limit int
}

func (b *countingBudget) Reserve(n int) bool {
	if b.limit > 0 && b.n+n > b.limit {
		return false
	}
	b.n += n
	return true
}

func (b *countingBudget) Release(n int) {
	if b.n -= n; b.n < 0 {
		b.t.Fatalf("released %d blocks more than reserved", -b.n)
	}
}

// TestEndpointRemovedRecord: the keys a server removed match with those it
// holds until it stores them again, the record keeps the most recent ones
// up to the most blocks the server held, a cleared or restarted server
// keeps none, held blocks take the record's budget when the budget is
// full, and every block reserved is released once everything is removed
// and the record cleared.
func TestEndpointRemovedRecord(t *testing.T) {
	h, _ := NewHasher(2, "s", "")
	a := h.Keys(nil, h.Root("m"), []uint32{1, 2, 3, 4, 5, 6})
	b := h.Keys(nil, h.Root("m"), []uint32{11, 12, 13, 14, 15, 16})
	stored := func(hashes []uint64, toks ...uint32) Event {
		return Event{Kind: BlockStored, BlockHashes: hashes, Tokens: toks, BlockSize: 2, Medium: "GPU"}
	}
	storeA := stored([]uint64{1, 2, 3}, 1, 2, 3, 4, 5, 6)
	storeB := stored([]uint64{11, 12, 13}, 11, 12, 13, 14, 15, 16)
	removed := func(medium string, hashes ...uint64) Event {
		return Event{Kind: BlockRemoved, BlockHashes: hashes, Medium: medium}
	}
	type match struct {
		keys                []uint64
		held, heldOrRemoved int
	}
	tests := []struct {
		name      string
		maxBlocks int
		limit     int
		batches   []Event // one batch each
		reset     bool    // the subscription resets after the batches
		want      []match
		record    int
		dropped   string
	}{
		{name: "removed blocks match as removed, not as held",
			batches: []Event{storeA, removed("GPU", 1, 2, 3)},
			want:    []match{{a, 0, 3}, {b, 0, 0}}, record: 3},
		{name: "a held head and a removed tail match together",
			batches: []Event{storeA, removed("GPU", 3)},
			want:    []match{{a, 2, 3}}, record: 1},
		{name: "a key stored again leaves the record",
			batches: []Event{storeA, removed("GPU", 1, 2, 3), storeA},
			want:    []match{{a, 3, 3}}, record: 0},
		{name: "keys stored again and removed again are the newest",
			batches: []Event{storeA, removed("GPU", 1, 2, 3), stored([]uint64{1, 2}, 1, 2, 3, 4), removed("GPU", 1, 2), storeB, removed("GPU", 11)},
			want:    []match{{a, 0, 2}, {a[2:], 0, 0}, {b, 0, 3}}, record: 3},
		{name: "a key held in another tier is not removed",
			batches: []Event{storeA, {Kind: BlockStored, BlockHashes: []uint64{1}, Medium: "CPU"}, removed("GPU", 1, 2)},
			want:    []match{{a, 1, 3}, {a[:2], 1, 2}}, record: 1},
		{name: "a removed block's hash reused for a removed key",
			batches: []Event{storeA, removed("GPU", 3), {Kind: BlockStored, BlockHashes: []uint64{1}, ParentHash: 2, HasParent: true, Tokens: []uint32{5, 6}, BlockSize: 2, Medium: "GPU"}},
			want:    []match{{a, 0, 0}, {a[1:], 2, 2}}, record: 0},
		{name: "past the most blocks held, the oldest removed are forgotten",
			batches: []Event{storeA, removed("GPU", 1, 2, 3), storeB, removed("GPU", 11, 12)},
			want:    []match{{a, 0, 0}, {a[2:], 0, 1}, {b, 0, 3}, {b[2:], 1, 1}}, record: 3},
		{name: "past maxBlocks, the oldest removed are forgotten",
			maxBlocks: 2,
			batches:   []Event{storeA, removed("GPU", 1, 2), storeB, removed("GPU", 11, 12)},
			want:      []match{{a, 0, 0}, {b, 0, 2}}, record: 2, dropped: DropBlocks},
		{name: "all blocks cleared: nothing held or removed",
			batches: []Event{storeA, removed("GPU", 2, 3), {Kind: AllBlocksCleared}},
			want:    []match{{a, 0, 0}}, record: 0},
		{name: "reset: nothing held or removed",
			batches: []Event{storeA, removed("GPU", 2, 3)}, reset: true,
			want: []match{{a, 0, 0}}, record: 0},
		{name: "held blocks take the record's budget when it is full",
			limit:   3,
			batches: []Event{storeA, removed("GPU", 1, 2, 3), storeB},
			want:    []match{{a, 0, 0}, {b, 3, 3}}, record: 0},
		{name: "held blocks take what they need of the record's budget, its oldest keys",
			limit:   4,
			batches: []Event{storeA, removed("GPU", 1, 2, 3), storeB},
			want:    []match{{a, 0, 0}, {a[2:], 0, 1}, {b, 3, 3}}, record: 1},
		{name: "a full budget and an empty record: the block is dropped",
			limit:   2,
			batches: []Event{storeA},
			want:    []match{{a, 2, 2}}, record: 0, dropped: DropBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			budget := &countingBudget{t: t, limit: tt.limit}
			dropped := map[string]int{}
			ep := newEndpoint(h, tt.maxBlocks, budget, func(r string, n int) { dropped[r] += n })
			ep.reset(true)
			for _, ev := range tt.batches {
				ep.apply("m", &Batch{Events: []Event{ev}})
			}
			if tt.reset {
				ep.reset(true)
			}
			for _, m := range tt.want {
				if n, ok := ep.Match(m.keys); !ok || n != m.held {
					t.Errorf("Match(%x) = %d, %v; want %d", m.keys, n, ok, m.held)
				}
				if n, ok := ep.MatchRemoved(m.keys); !ok || n != m.heldOrRemoved {
					t.Errorf("MatchRemoved(%x) = %d, %v; want %d", m.keys, n, ok, m.heldOrRemoved)
				}
			}
			if got := ep.removed.len(); got != tt.record {
				t.Errorf("%d keys recorded, want %d", got, tt.record)
			}
			if tt.dropped != "" && dropped[tt.dropped] == 0 {
				t.Errorf("nothing dropped for %s: %v", tt.dropped, dropped)
			}
			if budget.n != ep.Blocks()+ep.removed.len() {
				t.Errorf("budget counts %d blocks; %d held and %d recorded", budget.n, ep.Blocks(), ep.removed.len())
			}
			// Everything removed, then the record cleared: nothing is
			// left reserved.
			var all []Event
			for ek := range ep.engine {
				all = append(all, removed(ek.medium, ek.hash))
			}
			ep.apply("m", &Batch{Events: all})
			if budget.n != ep.removed.len() || ep.Blocks() != 0 {
				t.Errorf("everything removed: budget counts %d blocks; %d held and %d recorded", budget.n, ep.Blocks(), ep.removed.len())
			}
			ep.reset(true)
			if budget.n != 0 {
				t.Errorf("reset: budget counts %d blocks, want 0", budget.n)
			}
		})
	}
	// An unconfirmed index does not answer.
	ep := newEndpoint(h, 0, nil, func(string, int) {})
	if _, ok := ep.MatchRemoved(a); ok {
		t.Error("an unconfirmed index answered MatchRemoved")
	}
}

// TestRemovedRecordOrder: keys leave the record from anywhere, the oldest
// first, and their nodes are reused.
func TestRemovedRecordOrder(t *testing.T) {
	var r removedRecord
	for k := uint64(1); k <= 5; k++ {
		r.add(k)
	}
	for _, k := range []uint64{3, 1, 5} {
		if !r.forget(k) {
			t.Fatalf("forget(%d): not recorded", k)
		}
	}
	if r.forget(3) {
		t.Fatal("forget(3) twice")
	}
	r.add(6)
	r.add(7)
	var got []uint64
	for {
		k, ok := r.forgetOldest()
		if !ok {
			break
		}
		got = append(got, k)
	}
	if want := []uint64{2, 4, 6, 7}; !slices.Equal(got, want) {
		t.Errorf("forgotten oldest first: %v, want %v", got, want)
	}
	if len(r.nodes) != 5 {
		t.Errorf("%d nodes for at most 5 keys", len(r.nodes))
	}
	r.add(8)
	r.clear()
	if r.has(8) || r.len() != 0 {
		t.Error("clear kept a key")
	}
}
