// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"maps"
	"sync"
	"time"
)

// Budget is a process-wide bound on index blocks that the event index
// shares with other indexes: Reserve asks for n more blocks and reports
// whether they fit, Release returns them.
type Budget interface {
	Reserve(n int) bool
	Release(n int)
}

// PoolBudget is a Budget shared fairly between pools: each endpoint
// reserves its blocks from its pool's account, ForPool's.
type PoolBudget interface {
	Budget
	ForPool(namespace, pool string) Budget
}

// Drop reasons, the values of the dropped-events metric's reason label.
const (
	DropBlocks        = "endpoint_blocks"
	DropBudget        = "process_budget"
	DropUnknownParent = "unknown_parent"
	DropRate          = "rate"
	DropSize          = "message_bytes"
	DropDecode        = "decode"
)

// Endpoint is what the index knows of one endpoint's server: the blocks its
// events say it holds, those they say it removed recently, and those of
// prompts sent to it that they have yet to store (ExpectStored). The
// subscription that feeds it writes the first two, the pick path the
// third; the pick path reads it under the read lock.
type Endpoint struct {
	hasher    *Hasher
	maxBlocks int
	budget    Budget
	// dropped is called once per refused block or event, with the reason.
	dropped func(reason string, n int)

	mu sync.RWMutex
	// engine maps the server's hash of a block (and its tier) to the
	// block's key, which is the server's own hash when it hashes as Hasher
	// does.
	engine map[engineKey]uint64
	// keys counts the engine blocks (tiers) that hold each key, and the
	// epoch in which the key was last stored after a time unheld.
	keys map[uint64]keyState
	// epoch counts the batches applied (wrapping): a pick's mark, against
	// which RemovedSince tells the blocks removed after it.
	epoch uint32
	// confirmed: the index holds the server's whole history (it saw the
	// stream from its start, or replayed it, or the server cleared its
	// cache since); until then the scorer does not trust it.
	confirmed bool
	// removed records the keys whose last copy the server removed, most
	// recent last, for MatchRemoved: every replica reads the same events,
	// so each can send an evicted prefix back to the server that held it
	// last, where its own picks would differ. Its keys are reserved from
	// the budget as held blocks are.
	removed removedRecord
	// highWater is the most blocks the server was seen holding: the
	// record keeps at most as many keys, about what the server's cache
	// held before it evicted them.
	highWater int
	// expected are the keys of prompts sent to the server (ExpectStored)
	// that its events have not stored since, each with its deadline (Unix
	// nanoseconds): until the prefill stores them, a prompt of the same
	// prefix may count on them (MatchExpected). A key leaves when the
	// events store it, so a block evicted after that is not brought back.
	expected map[uint64]int64
	// nextSweep is when ExpectStored next drops the expired keys.
	nextSweep int64
}

// minExpected is the fewest keys an endpoint's expected set may hold
// however few blocks its server was seen holding: a new server's first
// prompts.
const minExpected = 4096

type keyState struct {
	refs   int32
	stored uint32
}

type engineKey struct {
	hash   uint64
	medium string
}

func newEndpoint(h *Hasher, maxBlocks int, budget Budget, dropped func(string, int)) *Endpoint {
	return &Endpoint{hasher: h, maxBlocks: maxBlocks, budget: budget, dropped: dropped,
		engine: map[engineKey]uint64{}, keys: map[uint64]keyState{}}
}

// Confirmed reports whether the index holds the server's whole history.
func (e *Endpoint) Confirmed() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.confirmed
}

// Blocks is the number of blocks (per tier) the server is believed to hold.
func (e *Endpoint) Blocks() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.engine)
}

// Match is how many leading keys the server holds; ok is false when the
// index is not confirmed (the caller falls back to what it learned).
func (e *Endpoint) Match(keys []uint64) (n int, ok bool) {
	return e.matchLeading(keys, func(uint64) bool { return false })
}

// MatchRemoved is how many leading keys the server holds or removed
// recently (of the last removed keys, as many as it held at most); ok is
// false when the index is not confirmed, as Match's.
func (e *Endpoint) MatchRemoved(keys []uint64) (n int, ok bool) {
	return e.matchLeading(keys, e.removed.has)
}

// ExpectStored records keys, the blocks of a prompt sent to the server,
// as about to be stored: MatchExpected and ExpectedBlocks count those the
// server does not hold until the events store them or until the deadline
// (now + ttl), the picker's guess of when the prefill is done. Expired keys
// are dropped every ttl; the set holds at most about as many keys as the
// server's cache (its most blocks seen, at least 4096, at most
// MaxBlocksPerEndpoint), each reserved from the budget as a held block is,
// and past that, or when the budget is full, the rest of keys go
// unrecorded.
func (e *Endpoint) ExpectStored(keys []uint64, now time.Time, ttl time.Duration) {
	nowNanos := now.UnixNano()
	deadline := nowNanos + int64(ttl)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expected == nil {
		e.expected = map[uint64]int64{}
	}
	if nowNanos >= e.nextSweep {
		n := len(e.expected)
		maps.DeleteFunc(e.expected, func(_ uint64, d int64) bool { return d <= nowNanos })
		e.release(n - len(e.expected))
		e.nextSweep = deadline
	}
	bound := max(e.highWater, minExpected)
	if e.maxBlocks > 0 {
		bound = min(bound, e.maxBlocks)
	}
	for _, k := range keys {
		if e.keys[k].refs > 0 {
			continue
		}
		if d, ok := e.expected[k]; ok {
			e.expected[k] = max(d, deadline)
			continue
		}
		if len(e.expected) >= bound || (e.budget != nil && !e.budget.Reserve(1)) {
			return
		}
		e.expected[k] = deadline
	}
}

// ExpectedBlocks is the number of blocks the server is expected to store
// (ExpectStored): those its events have not stored, their deadlines passed
// or not until the next sweep.
func (e *Endpoint) ExpectedBlocks() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.expected)
}

// MatchExpected is how many leading keys the server holds or is expected
// to store (ExpectStored) at now; ok is false when the index is not
// confirmed, as Match's.
func (e *Endpoint) MatchExpected(keys []uint64, now time.Time) (n int, ok bool) {
	nowNanos := now.UnixNano()
	return e.matchLeading(keys, func(k uint64) bool {
		d, ok := e.expected[k]
		return ok && d > nowNanos
	})
}

// matchLeading is how many leading keys the server holds or also has
// (called under the read lock); ok is false when the index is not
// confirmed.
func (e *Endpoint) matchLeading(keys []uint64, also func(k uint64) bool) (n int, ok bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.confirmed {
		return 0, false
	}
	for n < len(keys) && (e.keys[keys[n]].refs > 0 || also(keys[n])) {
		n++
	}
	return n, true
}

// Epoch is the index's mark now, for RemovedSince.
func (e *Endpoint) Epoch() uint32 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.epoch
}

// RemovedSince is how many of keys the server removed after epoch (an
// Epoch): those it no longer holds and those it stored again since. A
// server's queued request cannot pin its prefix, so the blocks a pick
// found may be evicted before the request's prefill; the prefill then
// stores them again. Meaningful while fewer than 2^31 batches separate
// the two marks.
func (e *Endpoint) RemovedSince(keys []uint64, epoch uint32) int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	n := 0
	for _, k := range keys {
		if st := e.keys[k]; st.refs == 0 || int32(st.stored-epoch) > 0 {
			n++
		}
	}
	return n
}

// reset forgets every block; confirmed says whether what follows is the
// whole history.
func (e *Endpoint) reset(confirmed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clear()
	e.confirmed = confirmed
}

// clear forgets every block, held or removed: a server that restarted or
// cleared its cache holds nothing of anything, so no prefix is its more
// than another's.
func (e *Endpoint) clear() {
	e.release(len(e.engine) + e.removed.len() + len(e.expected))
	clear(e.engine)
	clear(e.keys)
	clear(e.expected)
	e.removed.clear()
}

func (e *Endpoint) release(n int) {
	if e.budget != nil && n > 0 {
		e.budget.Release(n)
	}
}

func (e *Endpoint) setConfirmed() {
	e.mu.Lock()
	e.confirmed = true
	e.mu.Unlock()
}

// apply applies a batch of the server whose topic names model.
func (e *Endpoint) apply(model string, b *Batch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.epoch++
	var scratch []uint64
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case BlockStored:
			scratch = e.store(model, ev, scratch[:0])
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				e.remove(engineKey{h, ev.Medium})
			}
		case AllBlocksCleared:
			e.clear()
			// The server holds nothing: the index is its whole truth.
			e.confirmed = true
		}
	}
}

func (e *Endpoint) store(model string, ev *Event, keys []uint64) []uint64 {
	if len(ev.Tokens) == 0 {
		// A tier move without tokens: the blocks are known under another
		// tier, or not at all.
		for _, h := range ev.BlockHashes {
			if k, ok := e.findAnyTier(h); ok {
				e.add(engineKey{h, ev.Medium}, k)
			}
		}
		return keys
	}
	var parent uint64
	if ev.HasParent {
		k, ok := e.findAnyTier(ev.ParentHash)
		if !ok {
			e.dropped(DropUnknownParent, len(ev.BlockHashes))
			return keys
		}
		parent = k
	} else {
		root := model
		if ev.LoRAName != "" {
			root = ev.LoRAName
		}
		parent = e.hasher.Root(root)
	}
	if ev.BlockSize != e.hasher.BlockSize() {
		// Keys over blocks of another size never match a prompt's; the
		// server is configured unlike the scorer.
		e.dropped(DropBlocks, len(ev.BlockHashes))
		return keys
	}
	keys = e.hasher.Keys(keys, parent, ev.Tokens)
	for i, h := range ev.BlockHashes {
		if i >= len(keys) {
			break
		}
		e.add(engineKey{h, ev.Medium}, keys[i])
	}
	return keys
}

func (e *Endpoint) findAnyTier(h uint64) (uint64, bool) {
	for _, m := range [...]string{"GPU", "", "gpu", "CPU", "cpu"} {
		if k, ok := e.engine[engineKey{h, m}]; ok {
			return k, true
		}
	}
	for ek, k := range e.engine {
		if ek.hash == h {
			return k, true
		}
	}
	return 0, false
}

func (e *Endpoint) add(ek engineKey, key uint64) {
	if old, ok := e.engine[ek]; ok {
		if old == key {
			return
		}
		e.unref(old)
		e.engine[ek] = key
		if e.removed.forget(key) {
			e.release(1)
		}
		e.ref(key)
		return
	}
	if e.maxBlocks > 0 && len(e.engine) >= e.maxBlocks {
		e.dropped(DropBlocks, 1)
		return
	}
	// A key stored again leaves the record, its reservation with it.
	if !e.removed.forget(key) && !e.reserve() {
		e.dropped(DropBudget, 1)
		return
	}
	e.engine[ek] = key
	e.ref(key)
	e.highWater = max(e.highWater, len(e.engine))
}

// reserve reserves a held block from the budget; held blocks come first,
// so when the budget is full the oldest removed key gives its reservation.
func (e *Endpoint) reserve() bool {
	if e.budget == nil || e.budget.Reserve(1) {
		return true
	}
	_, ok := e.removed.forgetOldest()
	return ok
}

func (e *Endpoint) ref(k uint64) {
	st := e.keys[k]
	if st.refs == 0 {
		st.stored = e.epoch
		if _, ok := e.expected[k]; ok {
			delete(e.expected, k)
			e.release(1)
		}
	}
	st.refs++
	e.keys[k] = st
}

func (e *Endpoint) remove(ek engineKey) {
	k, ok := e.engine[ek]
	if !ok {
		return
	}
	delete(e.engine, ek)
	if e.unref(k) && e.record(k) {
		// The block's reservation is the record's now.
		return
	}
	e.release(1)
}

// unref reports whether k's last copy is gone.
func (e *Endpoint) unref(k uint64) bool {
	st := e.keys[k]
	if st.refs--; st.refs <= 0 {
		delete(e.keys, k)
		return true
	}
	e.keys[k] = st
	return false
}

// record records k, removed, in the record, under the reservation of the
// block it was; false when the record keeps nothing (the caller releases
// the block).
func (e *Endpoint) record(k uint64) bool {
	bound := e.highWater
	if e.maxBlocks > 0 {
		bound = min(bound, e.maxBlocks)
	}
	if bound <= 0 {
		return false
	}
	for e.removed.len() >= bound {
		e.removed.forgetOldest()
		e.release(1)
	}
	e.removed.add(k)
	return true
}

// removedRecord is a bounded record of keys in the order they were added:
// a doubly linked list in a slice, so that a key leaves it from anywhere,
// and the oldest first, without allocating once it has grown.
type removedRecord struct {
	at    map[uint64]int32 // key → its node
	nodes []recordNode
	// free is the first unused node, and oldest and newest the ends of
	// the list; -1 for none.
	free, oldest, newest int32
}

type recordNode struct {
	key        uint64
	prev, next int32
}

func (r *removedRecord) len() int { return len(r.at) }

func (r *removedRecord) has(k uint64) bool {
	_, ok := r.at[k]
	return ok
}

func (r *removedRecord) clear() {
	clear(r.at)
	r.nodes = r.nodes[:0]
	r.free, r.oldest, r.newest = -1, -1, -1
}

// add appends k, which the record does not hold, as the newest key.
func (r *removedRecord) add(k uint64) {
	if r.at == nil {
		r.at = map[uint64]int32{}
		r.free, r.oldest, r.newest = -1, -1, -1
	}
	i := r.free
	if i >= 0 {
		r.free = r.nodes[i].next
	} else {
		i = int32(len(r.nodes))
		r.nodes = append(r.nodes, recordNode{})
	}
	r.nodes[i] = recordNode{key: k, prev: r.newest, next: -1}
	if r.newest >= 0 {
		r.nodes[r.newest].next = i
	} else {
		r.oldest = i
	}
	r.newest = i
	r.at[k] = i
}

// forget takes k out of the record, reporting whether it was there.
func (r *removedRecord) forget(k uint64) bool {
	i, ok := r.at[k]
	if !ok {
		return false
	}
	delete(r.at, k)
	n := r.nodes[i]
	if n.prev >= 0 {
		r.nodes[n.prev].next = n.next
	} else {
		r.oldest = n.next
	}
	if n.next >= 0 {
		r.nodes[n.next].prev = n.prev
	} else {
		r.newest = n.prev
	}
	r.nodes[i].next = r.free
	r.free = i
	return true
}

// forgetOldest takes the oldest key out of the record; false when it is
// empty.
func (r *removedRecord) forgetOldest() (uint64, bool) {
	if len(r.at) == 0 {
		return 0, false
	}
	k := r.nodes[r.oldest].key
	r.forget(k)
	return k, true
}
