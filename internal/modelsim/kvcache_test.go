// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"bytes"
	"testing"
)

func prompt(blocks int, fill byte) []byte {
	return bytes.Repeat([]byte{fill}, blocks*4*BytesPerToken)
}

func TestPromptBlockHashesChain(t *testing.T) {
	a := promptBlockHashes("m", append(prompt(2, 'a'), prompt(1, 'b')...), 4, BytesPerToken)
	b := promptBlockHashes("m", append(prompt(2, 'a'), prompt(1, 'c')...), 4, BytesPerToken)
	c := promptBlockHashes("lora", append(prompt(2, 'a'), prompt(1, 'b')...), 4, BytesPerToken)
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("got %d and %d hashes, want 3", len(a), len(b))
	}
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Fatalf("shared prefix must share hashes and diverge after: %v %v", a, b)
	}
	if a[0] == c[0] {
		t.Fatalf("another model (adapter) must not share cache entries")
	}
	// A partial trailing block is not hashed.
	if got := promptBlockHashes("m", prompt(1, 'a')[:4*BytesPerToken-1], 4, BytesPerToken); got != nil {
		t.Fatalf("partial block hashed: %v", got)
	}
}

func TestKVCache(t *testing.T) {
	const bt = 4 // tokens per block
	type step struct {
		name         string
		prompt       []byte
		outputBlocks int
		release      int // index of an earlier step's allocation to release instead
		wantOK       bool
		wantCached   int // cached tokens
		wantUsed     int
		wantIdle     int
	}
	shared := prompt(3, 's')
	tests := []struct {
		name   string
		blocks int
		steps  []step
	}{{
		name:   "prefix reuse after release",
		blocks: 10,
		steps: []step{
			{name: "first", prompt: append(append([]byte{}, shared...), 'x'), outputBlocks: 1, release: -1, wantOK: true, wantCached: 0, wantUsed: 5},
			{name: "release first", release: 0, wantOK: true, wantUsed: 0, wantIdle: 3},
			{name: "same prefix", prompt: append(append([]byte{}, shared...), 'y'), outputBlocks: 1, release: -1, wantOK: true, wantCached: 3 * bt, wantUsed: 5, wantIdle: 0},
		},
	}, {
		name:   "shared while both run",
		blocks: 10,
		steps: []step{
			{name: "a", prompt: append(append([]byte{}, shared...), 'x'), outputBlocks: 0, release: -1, wantOK: true, wantUsed: 4},
			{name: "b", prompt: append(append([]byte{}, shared...), 'y'), outputBlocks: 0, release: -1, wantOK: true, wantCached: 3 * bt, wantUsed: 5},
		},
	}, {
		name:   "whole prompt cached still computes one token",
		blocks: 10,
		steps: []step{
			{name: "a", prompt: shared, release: -1, wantOK: true, wantUsed: 3},
			{name: "release", release: 0, wantOK: true, wantIdle: 3},
			{name: "again", prompt: shared, release: -1, wantOK: true, wantCached: 2 * bt, wantUsed: 3},
		},
	}, {
		name:   "does not fit",
		blocks: 4,
		steps: []step{
			{name: "a", prompt: prompt(2, 'a'), outputBlocks: 1, release: -1, wantOK: true, wantUsed: 3},
			{name: "b too big", prompt: prompt(2, 'b'), outputBlocks: 0, release: -1, wantOK: false, wantUsed: 3},
		},
	}, {
		name:   "evicts least recently used, chain tail first",
		blocks: 4,
		steps: []step{
			{name: "a", prompt: prompt(3, 'a'), release: -1, wantOK: true, wantUsed: 3},
			{name: "release a", release: 0, wantOK: true, wantIdle: 3},
			// b needs 2 new blocks: 1 free, 1 evicted (a's last block).
			{name: "b", prompt: prompt(2, 'b'), release: -1, wantOK: true, wantUsed: 2, wantIdle: 2},
			// a's first two blocks survived.
			{name: "a again", prompt: prompt(3, 'a'), release: -1, wantOK: false, wantUsed: 2, wantIdle: 2},
			{name: "release b", release: 2, wantOK: true, wantIdle: 4},
			{name: "a after b", prompt: prompt(3, 'a'), release: -1, wantOK: true, wantCached: 2 * bt, wantUsed: 3, wantIdle: 1},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newKVCache(bt, tt.blocks)
			allocs := make([]allocation, len(tt.steps))
			for i, s := range tt.steps {
				if s.prompt == nil {
					c.release(allocs[s.release])
				} else {
					tokens := (len(s.prompt) + BytesPerToken - 1) / BytesPerToken
					total := (tokens+bt-1)/bt + s.outputBlocks
					a, ok := c.allocate(promptBlockHashes("m", s.prompt, bt, BytesPerToken), nil, tokens, total)
					if ok != s.wantOK {
						t.Fatalf("%s: allocate ok=%v, want %v", s.name, ok, s.wantOK)
					}
					if a.cachedTokens != s.wantCached {
						t.Fatalf("%s: cached tokens %d, want %d", s.name, a.cachedTokens, s.wantCached)
					}
					allocs[i] = a
				}
				if got := c.usedBlocks(); got != s.wantUsed {
					t.Fatalf("%s: used blocks %d, want %d", s.name, got, s.wantUsed)
				}
				if got := c.idle.Len(); got != s.wantIdle {
					t.Fatalf("%s: idle blocks %d, want %d", s.name, got, s.wantIdle)
				}
				if c.freeBlocks() < 0 {
					t.Fatalf("%s: %d free blocks", s.name, c.freeBlocks())
				}
			}
		})
	}
}
