// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/cespare/xxhash/v2"
)

// Hash algorithms of block keys, as llm-d's kv-cache names them.
const (
	// HashCBORFNV is FNV-1a (64 bits) of the canonical CBOR encoding of
	// [parent, token ids, extra]: llm-d's default, and what its vLLM
	// simulator publishes as the blocks' hashes.
	HashCBORFNV = "cbor-fnv"
	// HashXXH64 is xxHash64 of the parent (8 bytes, little-endian), the
	// token ids (4 bytes each, little-endian) and the extra keys.
	HashXXH64 = "xxh64"
)

// Hasher computes block keys: a prompt's token ids cut into full blocks of
// BlockSize tokens, each key chained to the previous one, the first to a
// root derived from the seed and the model (a LoRA adapter's name for its
// blocks). Safe for concurrent use.
type Hasher struct {
	blockSize int
	xxh       bool
	// seedHash is the chain's origin before the model: the hash of the
	// seed string (vLLM's PYTHONHASHSEED, llm-d's hashSeed).
	seedHash uint64
}

// NewHasher returns the hasher of blockSize tokens per block, seed and
// algorithm ("" is HashCBORFNV).
func NewHasher(blockSize int, seed, algorithm string) (*Hasher, error) {
	if blockSize <= 0 || blockSize > 1<<16 {
		return nil, fmt.Errorf("kv events: block size %d must be between 1 and 65536", blockSize)
	}
	h := &Hasher{blockSize: blockSize}
	switch algorithm {
	case "", HashCBORFNV:
		f := fnv.New64a()
		_, _ = f.Write([]byte(seed))
		h.seedHash = f.Sum64()
	case HashXXH64:
		h.xxh = true
		h.seedHash = xxhash.Sum64String(seed)
	default:
		return nil, fmt.Errorf("kv events: hash algorithm %q: want %q or %q", algorithm, HashCBORFNV, HashXXH64)
	}
	return h, nil
}

// BlockSize is the tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Root is the parent of a sequence's first block under model.
func (h *Hasher) Root(model string) uint64 {
	if h.xxh {
		d := xxhash.New()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], h.seedHash)
		_, _ = d.Write(b[:])
		binary.LittleEndian.PutUint64(b[:], uint64(len(model)))
		_, _ = d.Write(b[:])
		_, _ = d.WriteString(model)
		return d.Sum64()
	}
	var buf [64]byte
	e := append(buf[:0], 0x83)
	e = cborHead(e, 0, h.seedHash)
	e = append(e, 0xf6) // no tokens
	e = cborHead(e, 3, uint64(len(model)))
	e = append(e, model...)
	return fnv64a(e)
}

// Keys appends to dst the keys of tokens' full blocks, chained from parent
// (Root for a sequence's start), and returns it.
func (h *Hasher) Keys(dst []uint64, parent uint64, tokens []uint32) []uint64 {
	var buf [16 + 5*1024]byte
	for i := 0; i+h.blockSize <= len(tokens); i += h.blockSize {
		block := tokens[i : i+h.blockSize]
		if h.xxh {
			parent = xxhBlock(parent, block)
		} else {
			e := append(buf[:0], 0x83)
			e = cborHead(e, 0, parent)
			e = cborHead(e, 4, uint64(len(block)))
			for _, t := range block {
				e = cborHead(e, 0, uint64(t))
			}
			e = append(e, 0xf6) // no extra keys
			parent = fnv64a(e)
		}
		dst = append(dst, parent)
	}
	return dst
}

func xxhBlock(parent uint64, block []uint32) uint64 {
	d := xxhash.New()
	var b [256]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	_, _ = d.Write(b[:8])
	for i := 0; i < len(block); {
		n := min(len(block)-i, len(b)/4)
		for j := range n {
			binary.LittleEndian.PutUint32(b[j*4:], block[i+j])
		}
		_, _ = d.Write(b[:n*4])
		i += n
	}
	return d.Sum64()
}

// cborHead appends a CBOR head of major type major and argument v in its
// shortest form (canonical CBOR).
func cborHead(e []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(e, m|byte(v))
	case v <= 0xff:
		return append(e, m|24, byte(v))
	case v <= 0xffff:
		return append(e, m|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(e, m|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return binary.BigEndian.AppendUint64(append(e, m|27), v)
}

func fnv64a(b []byte) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= prime
	}
	return h
}
