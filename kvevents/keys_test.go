// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"hash/fnv"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// referenceKeys is llm-d's formula written with a general CBOR encoder:
// FNV-1a of canonical CBOR [parent, tokens, extra].
func referenceKeys(t *testing.T, seed, model string, blockSize int, tokens []uint32) []uint64 {
	t.Helper()
	enc, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	h := func(v any) uint64 {
		b, err := enc.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		f := fnv.New64a()
		_, _ = f.Write(b)
		return f.Sum64()
	}
	f := fnv.New64a()
	_, _ = f.Write([]byte(seed))
	parent := h([]any{f.Sum64(), []uint32(nil), model})
	var out []uint64
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		parent = h([]any{parent, tokens[i : i+blockSize], nil})
		out = append(out, parent)
	}
	return out
}

func TestHasherMatchesCanonicalCBOR(t *testing.T) {
	tokens := []uint32{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 7, 8, 9, 10}
	for _, tt := range []struct {
		seed, model string
		blockSize   int
	}{
		{"", "m", 4},
		{"42", "Qwen/Qwen2.5-1.5B-Instruct", 4},
		{"42", "a-lora-adapter", 1},
		{"0", string(make([]byte, 300)), 13},
	} {
		h, err := NewHasher(tt.blockSize, tt.seed, "")
		if err != nil {
			t.Fatal(err)
		}
		got := h.Keys(nil, h.Root(tt.model), tokens)
		want := referenceKeys(t, tt.seed, tt.model, tt.blockSize, tokens)
		if !equal(got, want) {
			t.Errorf("seed %q model %q block %d: keys %x, want %x", tt.seed, tt.model, tt.blockSize, got, want)
		}
	}
}

func TestHasherChainsAndSeeds(t *testing.T) {
	h, _ := NewHasher(2, "1", HashXXH64)
	all := h.Keys(nil, h.Root("m"), []uint32{1, 2, 3, 4, 5})
	if len(all) != 2 {
		t.Fatalf("%d keys for 2 full blocks", len(all))
	}
	// Continuing from a key gives the same chain as hashing at once.
	if tail := h.Keys(nil, all[0], []uint32{3, 4}); tail[0] != all[1] {
		t.Errorf("chained key %x, want %x", tail[0], all[1])
	}
	other, _ := NewHasher(2, "2", HashXXH64)
	if other.Keys(nil, other.Root("m"), []uint32{1, 2})[0] == all[0] {
		t.Error("different seeds gave the same key")
	}
	if h.Keys(nil, h.Root("lora"), []uint32{1, 2})[0] == all[0] {
		t.Error("different models gave the same key")
	}
	for _, bad := range []struct {
		bs  int
		alg string
	}{{0, ""}, {16, "sha256"}} {
		if _, err := NewHasher(bad.bs, "", bad.alg); err == nil {
			t.Errorf("NewHasher(%d, %q): no error", bad.bs, bad.alg)
		}
	}
}
