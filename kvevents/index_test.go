// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import "testing"

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
