// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"sync"
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
// events say it holds. The subscription that feeds it is its only writer;
// the pick path reads it under the read lock.
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
}

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
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.confirmed {
		return 0, false
	}
	for n < len(keys) {
		if e.keys[keys[n]].refs == 0 {
			break
		}
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
	if e.budget != nil && len(e.engine) > 0 {
		e.budget.Release(len(e.engine))
	}
	clear(e.engine)
	clear(e.keys)
	e.confirmed = confirmed
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
			if e.budget != nil && len(e.engine) > 0 {
				e.budget.Release(len(e.engine))
			}
			clear(e.engine)
			clear(e.keys)
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
		e.ref(key)
		return
	}
	if e.maxBlocks > 0 && len(e.engine) >= e.maxBlocks {
		e.dropped(DropBlocks, 1)
		return
	}
	if e.budget != nil && !e.budget.Reserve(1) {
		e.dropped(DropBudget, 1)
		return
	}
	e.engine[ek] = key
	e.ref(key)
}

func (e *Endpoint) ref(k uint64) {
	st := e.keys[k]
	if st.refs == 0 {
		st.stored = e.epoch
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
	e.unref(k)
	if e.budget != nil {
		e.budget.Release(1)
	}
}

func (e *Endpoint) unref(k uint64) {
	st := e.keys[k]
	if st.refs--; st.refs <= 0 {
		delete(e.keys, k)
		return
	}
	e.keys[k] = st
}
