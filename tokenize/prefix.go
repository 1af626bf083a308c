// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"container/list"
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// prefixBlockBytes is the granularity, in bytes of the raw prompt, at which
// prompts are found to share a prefix.
const prefixBlockBytes = 256

// prefixStore learns the token ids of the prefixes prompts share, so that a
// prompt that starts with a learned prefix is scored from the prefix's
// tokens without a round trip.
//
// A render endpoint answers token ids only, without their offsets in the
// text, and a prefix tokenized alone may differ from the same text inside a
// longer prompt (a word cut in two, a dummy prefix, a merge across the cut).
// So the store never tokenizes a prefix alone: it compares the whole
// tokenizations of two prompts that share their first D bytes and differ at
// byte D+1. Their common leading tokens decode to text both prompts share,
// so within those D bytes; they came out alike under two different
// continuations, and the last of them, which may end at the cut, is dropped.
// What is left is taken as the tokens of those D bytes in any prompt that
// starts with them. The tokens of the rest of such a prompt are not known:
// the scorer keys the prefix's blocks only.
//
// Both maps are keyed by the chained hash of a prompt's leading blocks of
// prefixBlockBytes (seeded by model and prompt kind). Entries are evicted
// least recently used first beyond maxBytes.
type prefixStore struct {
	maxBytes int64
	// minShare is the least share of a prompt's bytes a learned prefix must
	// cover to stand for the prompt.
	minShare float64

	mu    sync.Mutex
	bytes int64
	lru   *list.List // of *prefixEntry, most recent first
	// seen holds, per block level, the last prompt tokenized whole that
	// reached it.
	seen map[uint64]*prefixEntry
	// learned holds, per block level, a prefix whose tokens are known.
	learned map[uint64]*prefixEntry
}

// prefixEntry is a prompt tokenized whole (raw set) or a learned prefix of
// n bytes whose hash is nHash.
type prefixEntry struct {
	raw    []byte
	levels []uint64 // the keys this entry is stored under
	tokens []uint32
	n      int
	nHash  uint64
	elem   *list.Element
}

func (e *prefixEntry) size() int64 {
	return int64(len(e.raw)+4*len(e.tokens)+8*len(e.levels)) + 128
}

func newPrefixStore(maxBytes int64, minShare float64) *prefixStore {
	return &prefixStore{maxBytes: maxBytes, minShare: minShare, lru: list.New(),
		seen: map[uint64]*prefixEntry{}, learned: map[uint64]*prefixEntry{}}
}

// levels are the chained hashes of raw's whole blocks under seed.
func levels(seed uint64, raw []byte) []uint64 {
	out := make([]uint64, 0, len(raw)/prefixBlockBytes)
	var d xxhash.Digest
	h := seed
	var b [8]byte
	for i := prefixBlockBytes; i <= len(raw); i += prefixBlockBytes {
		d.Reset()
		binary.LittleEndian.PutUint64(b[:], h)
		_, _ = d.Write(b[:])
		_, _ = d.Write(raw[i-prefixBlockBytes : i])
		h = d.Sum64()
		out = append(out, h)
	}
	return out
}

// tailHash is the hash of raw[:n] given the level hash of its whole blocks
// (seed when none).
func tailHash(level uint64, raw []byte, n int) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], level)
	_, _ = d.Write(b[:])
	_, _ = d.Write(raw[n/prefixBlockBytes*prefixBlockBytes : n])
	return d.Sum64()
}

// lookup returns the tokens of the longest learned prefix of raw (whose
// levels are lv) that covers at least minShare of it.
func (p *prefixStore) lookup(seed uint64, raw []byte, lv []uint64) ([]uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := len(lv) - 1; k >= 0; k-- {
		e := p.learned[lv[k]]
		if e == nil || e.n > len(raw) {
			continue
		}
		if float64(e.n) < p.minShare*float64(len(raw)) {
			// Shallower levels hold shorter prefixes still.
			return nil, false
		}
		if tailHash(levelAt(seed, lv, e.n), raw, e.n) != e.nHash {
			continue
		}
		p.lru.MoveToFront(e.elem)
		return e.tokens, true
	}
	return nil, false
}

// levelAt is the level hash of the whole blocks of a prefix of n bytes.
func levelAt(seed uint64, lv []uint64, n int) uint64 {
	if k := n / prefixBlockBytes; k > 0 {
		return lv[k-1]
	}
	return seed
}

// observe records raw's whole tokens and learns the prefix it shares with
// the last prompt seen at its deepest level.
func (p *prefixStore) observe(seed uint64, raw []byte, lv []uint64, tokens []uint32) {
	if len(lv) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := len(lv) - 1; k >= 0; k-- {
		prev := p.seen[lv[k]]
		if prev == nil {
			continue
		}
		n := commonBytes(prev.raw, raw)
		if n == len(raw) && n == len(prev.raw) {
			break // the same prompt
		}
		t := commonTokens(prev.tokens, tokens) - 1
		if t <= 0 || n < prefixBlockBytes {
			break
		}
		// Of two prefixes ending in the same block the shorter stays: more
		// prompts start with it (the longer one holds the start of the two
		// prompts' own parts when those begin alike).
		key := lv[n/prefixBlockBytes-1]
		if old := p.learned[key]; old != nil && old.n <= n {
			break
		}
		// The learned tokens are copied: they outlive the prompts'.
		p.add(&prefixEntry{levels: []uint64{key}, tokens: append([]uint32(nil), tokens[:t]...), n: n,
			nHash: tailHash(levelAt(seed, lv, n), raw, n)}, p.learned)
		break
	}
	p.add(&prefixEntry{raw: append([]byte(nil), raw...), levels: lv, tokens: tokens}, p.seen)
	for p.bytes > p.maxBytes && p.lru.Len() > 0 {
		p.evict(p.lru.Back().Value.(*prefixEntry))
	}
}

func (p *prefixStore) add(e *prefixEntry, m map[uint64]*prefixEntry) {
	for _, k := range e.levels {
		if old := m[k]; old != nil {
			p.unlink(old, k, m)
		}
		m[k] = e
	}
	e.elem = p.lru.PushFront(e)
	p.bytes += e.size()
}

// unlink removes old from m at k; an entry stored nowhere is evicted.
func (p *prefixStore) unlink(old *prefixEntry, k uint64, m map[uint64]*prefixEntry) {
	delete(m, k)
	for _, l := range old.levels {
		if m[l] == old {
			return
		}
	}
	p.lru.Remove(old.elem)
	p.bytes -= old.size()
}

func (p *prefixStore) evict(e *prefixEntry) {
	m := p.learned
	if e.raw != nil {
		m = p.seen
	}
	for _, k := range e.levels {
		if m[k] == e {
			delete(m, k)
		}
	}
	p.lru.Remove(e.elem)
	p.bytes -= e.size()
}

func commonBytes(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func commonTokens(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
