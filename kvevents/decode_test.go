// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// encode is a test helper: the msgpack of v, as Python's msgpack writes
// lists, ints, None and strings.
func encode(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeBatch(t *testing.T) {
	sha := make([]byte, 32)
	binary.BigEndian.PutUint64(sha[24:], 0xdeadbeef01)
	tests := []struct {
		name    string
		payload any
		want    []Event
		rank    int
		wantErr string
	}{
		{name: "positional stored, removed, cleared (vLLM array_like)", rank: 0, payload: []any{1.5, []any{
			[]any{"BlockStored", []any{uint64(1) << 63, 7}, nil, []any{1, 2, 3, 4, 5, 6, 7, 8}, 4, nil, "GPU", nil},
			[]any{"BlockRemoved", []any{7}, "GPU"},
			[]any{"AllBlocksCleared"},
		}, 0}, want: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{1 << 63, 7}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU"},
			{Kind: BlockRemoved, BlockHashes: []uint64{7}, Medium: "GPU"},
			{Kind: AllBlocksCleared},
		}},
		{name: "named fields (vLLM map format), null parent, lora", rank: -1, payload: []any{2.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{11}, "parent_block_hash": 9, "token_ids": []any{1, 2}, "block_size": 2, "lora_name": "ad", "group_idx": 0},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{11}},
		}}, want: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{11}, ParentHash: 9, HasParent: true, Tokens: []uint32{1, 2}, BlockSize: 2, LoRAName: "ad"},
			{Kind: BlockRemoved, BlockHashes: []uint64{11}},
		}},
		{name: "sha256 bytes hashes and negative ints", rank: 3, payload: []any{0.0, []any{
			[]any{"BlockRemoved", []any{sha, -1}},
		}, 3}, want: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{0xdeadbeef01, ^uint64(0)}}}},
		{name: "unknown event kinds skipped", rank: -1, payload: []any{0.0, []any{[]any{"NewKind", 1}, map[string]any{"type": "Other"}}}},
		{name: "not a batch", payload: map[string]any{"a": 1}, wantErr: "batch"},
		{name: "tokens do not fill blocks", payload: []any{0.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, 2, 3}, 4}}}, wantErr: "carries 3 tokens"},
		{name: "map without type", payload: []any{0.0, []any{map[string]any{"block_hashes": []any{}}}}, wantErr: `without "type"`},
		{name: "token not an int", payload: []any{0.0, []any{[]any{"BlockStored", []any{1}, nil, []any{"x"}, 1}}}, wantErr: "token_ids"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeBatch(encode(t, tt.payload), Limits{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.DataParallelRank != tt.rank {
				t.Errorf("rank = %d, want %d", b.DataParallelRank, tt.rank)
			}
			if len(b.Events) != len(tt.want) {
				t.Fatalf("events = %+v, want %+v", b.Events, tt.want)
			}
			for i := range tt.want {
				g, w := b.Events[i], tt.want[i]
				if g.Kind != w.Kind || g.ParentHash != w.ParentHash || g.HasParent != w.HasParent || g.BlockSize != w.BlockSize ||
					g.LoRAName != w.LoRAName || g.Medium != w.Medium || !equal(g.BlockHashes, w.BlockHashes) || !equal(g.Tokens, w.Tokens) {
					t.Errorf("event %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDecodeBatchLimits(t *testing.T) {
	payload := encode(t, []any{0.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}, []any{"AllBlocksCleared"}}})
	for _, tt := range []struct {
		lim  Limits
		want string
	}{
		{Limits{Events: 1}, "more than the limit 1"},
		{Limits{BlockHashes: 2}, "3 hashes, more than the limit 2"},
	} {
		if _, err := DecodeBatch(payload, tt.lim); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("limits %+v: err = %v, want %q", tt.lim, err, tt.want)
		}
	}
	// A forged length beyond the payload is refused before any allocation.
	forged := []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff}
	if _, err := DecodeBatch(forged, Limits{}); err == nil || !strings.Contains(err.Error(), "beyond") {
		t.Errorf("forged length: err = %v", err)
	}
}

func TestParseFramesAndTopic(t *testing.T) {
	m, err := ParseFrames([][]byte{[]byte("kv@10.0.0.1:8000@org/model@v2"), {0, 0, 0, 0, 0, 0, 1, 2}, {0x90}})
	if err != nil || m.Seq != 258 {
		t.Fatalf("ParseFrames = %+v, %v", m, err)
	}
	ep, model, err := ParseTopic(m.Topic)
	if err != nil || ep != "10.0.0.1:8000" || model != "org/model@v2" {
		t.Fatalf("ParseTopic = %q %q %v", ep, model, err)
	}
	for _, bad := range [][][]byte{{{1}}, {{}, {1, 2}, {}}} {
		if _, err := ParseFrames(bad); err == nil {
			t.Errorf("ParseFrames(%v): no error", bad)
		}
	}
	for _, bad := range []string{"kv", "x@a@b", "kv@@m", "kv@a"} {
		if _, _, err := ParseTopic(bad); err == nil {
			t.Errorf("ParseTopic(%q): no error", bad)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(encode(f, []any{1.5, []any{[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU", nil}}, 0}))
	f.Add(encode(f, []any{1.5, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte{1, 2}}}}}))
	f.Add(encode(f, []any{1.5, []any{[]any{"AllBlocksCleared"}}}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload, Limits{Events: 64, BlockHashes: 64, Tokens: 1024})
		if err != nil {
			return
		}
		for _, ev := range b.Events {
			if len(ev.BlockHashes) > 64 || len(ev.Tokens) > 1024 || ev.Kind == 0 {
				t.Fatalf("event beyond its limits: %+v", ev)
			}
		}
	})
}
