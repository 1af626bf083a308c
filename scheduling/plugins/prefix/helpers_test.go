// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

// Accessors only the tests read: the picker never asks an LRU or an
// endpoint how much it holds.

// contains reports whether h is held, leaving its recency alone.
func (l *blockLRU) contains(h uint64) bool {
	_, ok := l.pos[h]
	return ok
}

func (l *blockLRU) len() int { return len(l.pos) }

func (pe *prefixEndpoint) len() int {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.lru == nil {
		return 0
	}
	return pe.lru.len()
}
