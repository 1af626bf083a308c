// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

// blockLRU is a least-recently-used set of block hashes holding at most
// capacity of them. It is the per-endpoint part of the prefix index, touched
// for every block of every pick, so it is built for that: entries live in a
// slice linked by int32 positions and the map holds positions, so nothing
// in it is a pointer (the garbage collector skips it, and a touch costs no
// write barrier), and a touch is one map lookup and a few stores.
type blockLRU struct {
	pos map[uint64]int32
	// entries[0] is the list head: its next is the most recent entry, its
	// prev the least recent.
	entries  []lruEntry
	free     []int32
	capacity int
	onEvict  func(h uint64)
	// evictions counts the blocks ever pushed out, so a caller can tell
	// that positions it holds may have been reused.
	evictions uint64
	// clock stamps entries as they become the most recent, so stamps fall
	// from the head of the list to its tail.
	clock uint64
	// phantoms maps the positions of phantom entries to their weights. A
	// phantom stands for blocks the server cached that this LRU does not
	// know by hash (other picker replicas' requests: age): they take room
	// and age out like blocks, so the known blocks are evicted when the
	// server's cache evicts them. phantomBlocks is the sum of the weights.
	phantoms      map[int32]int
	phantomBlocks int
	// liveBlocks counts the entries marked live (markLive): blocks a
	// prompt found here after they were added.
	liveBlocks int
}

type lruEntry struct {
	key        uint64
	stamp      uint64
	prev, next int32
	live       bool
}

// newBlockLRU returns an empty LRU; onEvict hears of each block pushed out
// by an add or a resize.
func newBlockLRU(capacity int, onEvict func(h uint64)) *blockLRU {
	return &blockLRU{pos: make(map[uint64]int32), entries: make([]lruEntry, 1), capacity: max(capacity, 1), onEvict: onEvict}
}

// touch makes h the most recent block and reports whether it was held.
func (l *blockLRU) touch(h uint64) bool {
	i, ok := l.pos[h]
	if ok && l.entries[0].next != i {
		l.unlink(i)
		l.pushFront(i)
	}
	return ok
}

// add makes h, which must not be held, the most recent block, evicting the
// least recent one when full.
func (l *blockLRU) add(h uint64) {
	l.trimTo(l.capacity - 1)
	i := l.newEntry()
	l.entries[i].key = h
	l.pushFront(i)
	l.pos[h] = i
}

func (l *blockLRU) newEntry() int32 {
	if n := len(l.free); n > 0 {
		i := l.free[n-1]
		l.free = l.free[:n-1]
		return i
	}
	l.entries = append(l.entries, lruEntry{})
	return int32(len(l.entries) - 1)
}

// age makes room for n blocks the server cached that this LRU cannot name:
// they become the most recent entries (one phantom entry), and the least
// recent ones beyond the capacity are evicted, as the server's cache does.
func (l *blockLRU) age(n int) {
	n = min(n, l.capacity)
	if n <= 0 {
		return
	}
	if l.phantoms == nil {
		l.phantoms = make(map[int32]int)
	}
	l.phantomBlocks += n
	if front := l.entries[0].next; front != 0 {
		if w, ok := l.phantoms[front]; ok {
			// Two ages with no block between are one phantom.
			l.phantoms[front] = w + n
			l.trimTo(l.capacity)
			return
		}
	}
	i := l.newEntry()
	l.entries[i].key = 0
	l.pushFront(i)
	l.phantoms[i] = n
	l.trimTo(l.capacity)
}

// trimTo evicts the least recent entries until the blocks and phantom
// blocks held are at most limit; a phantom entry at the tail gives up only
// as much of its weight as needed.
func (l *blockLRU) trimTo(limit int) {
	for over := len(l.pos) + l.phantomBlocks - limit; over > 0; over = len(l.pos) + l.phantomBlocks - limit {
		tail := l.entries[0].prev
		if w, ok := l.phantoms[tail]; ok && w > over {
			l.phantoms[tail] = w - over
			l.phantomBlocks -= over
			return
		}
		l.evictOldest()
	}
}

// trimBlocksTo evicts the least recent entries until the LRU holds at most
// n blocks' hashes (phantoms, which cost no hash, are not counted).
func (l *blockLRU) trimBlocksTo(n int) {
	for len(l.pos) > n && l.entries[0].prev != 0 {
		l.evictOldest()
	}
}

// stampOf returns h's stamp (how recently it was used; larger is more
// recent) and whether h is held.
func (l *blockLRU) stampOf(h uint64) (uint64, bool) {
	i, ok := l.pos[h]
	if !ok {
		return 0, false
	}
	return l.entries[i].stamp, true
}

// dropUsedBefore evicts every block whose stamp is below stamp (used less
// recently than the block that had it), and returns how many. With
// dropped non-nil, the blocks evicted are appended to it too, the least
// recent first.
func (l *blockLRU) dropUsedBefore(stamp uint64, dropped *[]uint64) int {
	n := 0
	for i := l.entries[0].prev; i != 0 && l.entries[i].stamp < stamp; i = l.entries[0].prev {
		if _, phantom := l.phantoms[i]; dropped != nil && !phantom {
			*dropped = append(*dropped, l.entries[i].key)
		}
		l.evictOldest()
		n++
	}
	return n
}

// markLive marks the held blocks of hashes live: a prompt found them here,
// so they are a prefix still in use rather than the tail of one prompt.
// hashes is a chain's leading blocks: when its last is marked, the rest
// were marked with it, and the check costs one lookup.
func (l *blockLRU) markLive(hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	if i, ok := l.pos[hashes[len(hashes)-1]]; ok && l.entries[i].live {
		return
	}
	for _, h := range hashes {
		if i, ok := l.pos[h]; ok && !l.entries[i].live {
			l.entries[i].live = true
			l.liveBlocks++
		}
	}
}

// remove evicts h if held and reports whether it was.
func (l *blockLRU) remove(h uint64) bool {
	i, ok := l.pos[h]
	if ok {
		l.evict(i)
	}
	return ok
}

// resize sets the capacity, evicting the least recent blocks beyond it.
func (l *blockLRU) resize(capacity int) {
	l.capacity = max(capacity, 1)
	l.trimTo(l.capacity)
}

// keys returns the held blocks, most recent first.
func (l *blockLRU) keys() []uint64 {
	out := make([]uint64, 0, len(l.pos))
	for i := l.entries[0].next; i != 0; i = l.entries[i].next {
		if _, phantom := l.phantoms[i]; !phantom {
			out = append(out, l.entries[i].key)
		}
	}
	return out
}

// evictOldest evicts the least recent entry: a block, or a phantom entry
// whole.
func (l *blockLRU) evictOldest() {
	if i := l.entries[0].prev; i != 0 {
		l.evict(i)
	}
}

// evict takes entry i out of the list, a phantom's weight or a block's
// hash with it.
func (l *blockLRU) evict(i int32) {
	l.unlink(i)
	l.evictions++
	l.free = append(l.free, i)
	if l.entries[i].live {
		l.entries[i].live = false
		l.liveBlocks--
	}
	if len(l.phantoms) > 0 {
		if w, ok := l.phantoms[i]; ok {
			delete(l.phantoms, i)
			l.phantomBlocks -= w
			return
		}
	}
	h := l.entries[i].key
	delete(l.pos, h)
	if l.onEvict != nil {
		l.onEvict(h)
	}
}

func (l *blockLRU) unlink(i int32) {
	e := &l.entries[i]
	l.entries[e.prev].next = e.next
	l.entries[e.next].prev = e.prev
}

func (l *blockLRU) pushFront(i int32) {
	l.clock++
	l.entries[i].stamp = l.clock
	first := l.entries[0].next
	l.entries[i].prev, l.entries[i].next = 0, first
	l.entries[first].prev = i
	l.entries[0].next = i
}

// frontRun reports how many of hashes, from the first, are the most recent
// blocks in that order (hashes[0] the most recent), and the positions of the
// first and the last of them. Walking the list costs no map lookup.
func (l *blockLRU) frontRun(hashes []uint64) (n int, first, last int32) {
	first = l.entries[0].next
	for i := first; i != 0 && n < len(hashes) && l.entries[i].key == hashes[n]; i = l.entries[i].next {
		last = i
		n++
	}
	return n, first, last
}

// isRun reports whether hashes (at least one) are linked, in order, from
// position first to position last.
func (l *blockLRU) isRun(hashes []uint64, first, last int32) bool {
	i := first
	for k, h := range hashes {
		if i == 0 || l.entries[i].key != h {
			return false
		}
		if k == len(hashes)-1 {
			return i == last
		}
		i = l.entries[i].next
	}
	return false
}

// moveRunToFront makes the linked run of entries from first to last the
// most recent, keeping its order: what touching them last to first does,
// without a lookup per block.
func (l *blockLRU) moveRunToFront(first, last int32) {
	if l.entries[0].next == first {
		return
	}
	before, after := l.entries[first].prev, l.entries[last].next
	l.entries[before].next = after
	l.entries[after].prev = before
	front := l.entries[0].next
	l.entries[first].prev = 0
	l.entries[last].next = front
	l.entries[front].prev = last
	l.entries[0].next = first
	// Restamp the run, its last entry first, so stamps still fall along
	// the list.
	for i := last; ; i = l.entries[i].prev {
		l.clock++
		l.entries[i].stamp = l.clock
		if i == first {
			break
		}
	}
}
