// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import "github.com/poolpicker/poolpicker/scheduling/framework"

// What the scorer's index holds, for tests (this package's, and the
// scheduler's in prefix_test) of what it keeps and drops when pools and
// endpoints leave.

// IndexedBlocks counts the distinct blocks indexed for the pool.
func (s *Scorer) IndexedBlocks(pool framework.Pool) int {
	if v, ok := s.indexes.Load(pool); ok {
		return v.(*prefixIndex).blocks()
	}
	return 0
}

// IndexedPools counts the pools with an index.
func (s *Scorer) IndexedPools() int {
	n := 0
	s.indexes.Range(func(_, _ any) bool { n++; return true })
	return n
}

// Holds reports whether any index entry or LRU of the pool names e.
func (s *Scorer) Holds(pool framework.Pool, e framework.Endpoint) bool {
	v, ok := s.indexes.Load(pool)
	if !ok {
		return false
	}
	x := v.(*prefixIndex)
	if x.lookup(e.Key()) != nil {
		return true
	}
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for _, hs := range sh.m {
			if hs.first != nil && hs.first.key == e.Key() {
				sh.mu.RUnlock()
				return true
			}
			for _, pe := range hs.rest() {
				if pe.key == e.Key() {
					sh.mu.RUnlock()
					return true
				}
			}
		}
		sh.mu.RUnlock()
	}
	return false
}

// Params returns the scorer's parameters, defaults filled in.
func (s *Scorer) Params() Params { return s.params }

// LearnedParams returns the precise scorer's learned index's parameters,
// defaults filled in.
func (s *Precise) LearnedParams() Params { return s.approx.params }

// blocks counts the distinct blocks in the index.
func (x *prefixIndex) blocks() int {
	n := 0
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}
