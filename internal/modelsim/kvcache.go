// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"container/list"
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// blockHash identifies a full prompt block by its content and everything
// before it (the hashes are chained), as vLLM's prefix cache does.
type blockHash uint64

// promptBlockHashes cuts the prompt into blocks of blockTokens tokens
// (bytesPerToken bytes each) and hashes every full block chained to the
// previous one. The chain starts from the model name, because a LoRA adapter
// computes different keys and values for the same text.
func promptBlockHashes(model string, prompt []byte, blockTokens, bytesPerToken int) []blockHash {
	blockBytes := blockTokens * bytesPerToken
	n := len(prompt) / blockBytes
	if n == 0 {
		return nil
	}
	hashes := make([]blockHash, n)
	prev := xxhash.Sum64String(model)
	var d xxhash.Digest
	var seed [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(seed[:], prev)
		_, _ = d.Write(seed[:])
		_, _ = d.Write(prompt[i*blockBytes : (i+1)*blockBytes])
		prev = d.Sum64()
		hashes[i] = blockHash(prev)
	}
	return hashes
}

// kvCache is the server's KV-cache block pool. Blocks are free, held by
// running requests, or cached: full prompt blocks whose request finished stay
// in the cache, indexed by hash, until a new allocation needs their space and
// evicts the least recently used one. Not safe for concurrent use: the engine
// serialises access.
type kvCache struct {
	blockTokens int
	totalBlocks int
	// anonymousBlocks are held by running requests without a hash: partial
	// prompt blocks and output blocks, freed when the request ends.
	anonymousBlocks int
	// cached holds every hashed block, held or idle.
	cached map[blockHash]*cachedBlock
	// idle lists hashed blocks no request holds, most recently released at
	// the front; eviction takes from the back.
	idle list.List
	// record makes allocate note its stores and evictions in events, for
	// the server's KV-event publisher.
	record bool
	events []kvEvent
}

// blockMeta is what a BlockStored event says of a prompt's blocks beyond
// their hashes.
type blockMeta struct {
	tokens   []uint32
	loraName string
}

type cachedBlock struct {
	hash blockHash
	refs int
	// elem is the block's place in idle while refs is zero.
	elem *list.Element
}

// allocation is what one request holds in the cache.
type allocation struct {
	hashed          []blockHash
	anonymousBlocks int
	// cachedTokens are the prompt tokens found in the cache, which need no
	// prefill.
	cachedTokens int
}

func newKVCache(blockTokens, totalBlocks int) *kvCache {
	return &kvCache{blockTokens: blockTokens, totalBlocks: totalBlocks, cached: map[blockHash]*cachedBlock{}}
}

func (c *kvCache) freeBlocks() int { return c.totalBlocks - len(c.cached) - c.anonymousBlocks }

// usedBlocks are the blocks held by running requests (idle cached blocks are
// reusable space, as vLLM counts them).
func (c *kvCache) usedBlocks() int { return c.totalBlocks - c.freeBlocks() - c.idle.Len() }

// cachedPrefixBlocks is how many leading blocks of hashes are cached, capped
// so that at least one prompt token is always computed.
func (c *kvCache) cachedPrefixBlocks(hashes []blockHash, promptTokens int) int {
	limit := (promptTokens - 1) / c.blockTokens
	n := 0
	for n < len(hashes) && n < limit {
		if _, ok := c.cached[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// allocate reserves totalBlocks blocks for a request whose full prompt blocks
// have the given hashes (nil: no prefix caching), reusing the cached prefix.
// It reports false, changing nothing, when the cache cannot hold the request
// even after evicting every idle block.
// meta, when the cache records events, gives the blocks' tokens.
func (c *kvCache) allocate(hashes []blockHash, meta *blockMeta, promptTokens, totalBlocks int) (allocation, bool) {
	hits := c.cachedPrefixBlocks(hashes, promptTokens)
	idleHits := 0
	for _, h := range hashes[:hits] {
		if c.cached[h].refs == 0 {
			idleHits++
		}
	}
	if totalBlocks-hits > c.freeBlocks()+c.idle.Len()-idleHits {
		return allocation{}, false
	}
	for _, h := range hashes[:hits] {
		c.hold(c.cached[h])
	}
	for i, h := range hashes[hits:] {
		if b, ok := c.cached[h]; ok {
			// A later block survived although an earlier one was evicted.
			c.hold(b)
			continue
		}
		c.makeRoom()
		c.cached[h] = &cachedBlock{hash: h, refs: 1}
		if c.record && meta != nil {
			c.noteStored(hashes, hits+i, meta)
		}
	}
	anon := totalBlocks - len(hashes)
	for range anon {
		c.makeRoom()
		c.anonymousBlocks++
	}
	return allocation{hashed: hashes, anonymousBlocks: anon, cachedTokens: hits * c.blockTokens}, true
}

func (c *kvCache) hold(b *cachedBlock) {
	if b.refs == 0 {
		c.idle.Remove(b.elem)
		b.elem = nil
	}
	b.refs++
}

// makeRoom frees one block when none is free by evicting the least recently
// used idle block; allocate has checked that one exists.
func (c *kvCache) makeRoom() {
	if c.freeBlocks() > 0 {
		return
	}
	back := c.idle.Back()
	b := back.Value.(*cachedBlock)
	c.idle.Remove(back)
	delete(c.cached, b.hash)
	if c.record {
		c.events = append(c.events, kvEvent{hashes: []blockHash{b.hash}})
	}
}

// noteStored records block i of hashes as stored: appended to the previous
// event when that stored block i-1, as one BlockStored of several blocks.
func (c *kvCache) noteStored(hashes []blockHash, i int, meta *blockMeta) {
	tokens := meta.tokens[i*c.blockTokens : (i+1)*c.blockTokens]
	if n := len(c.events); n > 0 && c.events[n-1].stored && i > 0 {
		last := &c.events[n-1]
		if last.hashes[len(last.hashes)-1] == hashes[i-1] {
			last.hashes = append(last.hashes, hashes[i])
			last.tokens = append(last.tokens, tokens...)
			return
		}
	}
	ev := kvEvent{stored: true, hashes: []blockHash{hashes[i]}, tokens: slices.Clone(tokens), loraName: meta.loraName}
	if i > 0 {
		ev.parent = hashes[i-1]
	}
	c.events = append(c.events, ev)
}

// release returns a request's blocks. Its hashed blocks stay cached; they are
// released last block first so that a prompt's leading blocks, the ones other
// prompts share, are the most recently used and the last evicted.
func (c *kvCache) release(a allocation) {
	c.anonymousBlocks -= a.anonymousBlocks
	for i := len(a.hashed) - 1; i >= 0; i-- {
		b := c.cached[a.hashed[i]]
		b.refs--
		if b.refs == 0 {
			b.elem = c.idle.PushFront(b)
		}
	}
}
