// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// prefixShards is the number of lock shards of a pool's block index; a
// power of two so a hash picks its shard with a mask.
const prefixShards = 32

// prefixIndex approximates which prompt blocks each endpoint of one pool has
// in its KV cache. Per endpoint, an LRU of block hashes bounded like the
// server's cache; per pool, an inverted index from block hash to the
// endpoints holding it, which is what scoring reads: a 4 KB prompt is 64
// index lookups, not 64 per endpoint.
//
// Locks: scoring takes shard read locks only. Recording takes the
// endpoint's mutex, then shard write locks (the LRU's eviction callback).
// Endpoint creation and removal take mu, then the endpoint's mutex. Nothing
// is shared between pools.
type prefixIndex struct {
	shards [prefixShards]indexShard

	// endpoints is an immutable map replaced whole under mu; reads are
	// lock-free.
	endpoints atomic.Pointer[map[framework.EndpointKey]*prefixEndpoint]
	// slots is the high-water mark of endpoint slot numbers.
	slots atomic.Int32
	// version counts changes of endpoints; aligned is the endpoint states
	// in the order of one EndpointSet, so scoring finds a candidate's state
	// by position instead of by map lookup. Rebuilt when either changes.
	version atomic.Uint64
	aligned atomic.Pointer[alignedView]

	mu        sync.Mutex
	freeSlots []int32
	removed   bool

	// share is the pool's account of the process's index memory budget,
	// in blocks (nil: no budget); released is set once the pool is gone
	// and its endpoints' charges are given back.
	share    *fairshare.Party
	released atomic.Bool

	// missShare is the pool's recent share of prompt tokens its servers
	// reported not cached, a moving average (float64 bits; 0 until the
	// first report, when hasMissShare is set).
	missShare    atomic.Uint64
	hasMissShare atomic.Bool

	// tokenScale is the servers' prompt tokens over the scorer's estimate
	// of them (prompt bytes over BytesPerToken), a moving average of the
	// reports of whole prompts (float64 bits; hasTokenScale is false until
	// the first): what scales the estimate of a prompt cut before its end.
	tokenScale    atomic.Uint64
	hasTokenScale atomic.Bool

	// loadShare is the pool's recent share of the servers' requests that
	// this replica has in flight, a moving average (float64 bits; 0 until
	// the first sample, when hasLoadShare is set): about 1 with one picker
	// replica, 1/N with N replicas that the streams are spread over alike.
	loadShare    atomic.Uint64
	hasLoadShare atomic.Bool

	// wait is what a request ahead costs on the pool's endpoints, as
	// their responses show (Params.QueueCostFromServers).
	wait waitCost
}

// loadShareWeight is the weight of one sample in the moving average of
// the replica's share of the load: about the last twenty rendezvous
// choices.
const loadShareWeight = 0.05

// maxReplicaEstimate bounds the estimated number of replicas: a replica
// that gets almost none of the streams would otherwise take the slack
// without bound.
const maxReplicaEstimate = 8

// observeLoadShare folds one sample into the replica's share of the load:
// own requests in flight on the scraped endpoints against the requests
// the servers reported running and waiting. A sample with nothing
// reported says nothing. Samples race; a lost update does not matter.
func (x *prefixIndex) observeLoadShare(own, scraped int64) {
	if scraped <= 0 {
		return
	}
	// In flight counts a request from its pick until its response ends,
	// a scrape only while the server has it, and the scrape lags: with one
	// replica the ratio is about 1 and may exceed it.
	share := min(float64(own)/float64(scraped), 1)
	if !x.hasLoadShare.Load() {
		x.loadShare.Store(math.Float64bits(share))
		x.hasLoadShare.Store(true)
		return
	}
	old := math.Float64frombits(x.loadShare.Load())
	x.loadShare.Store(math.Float64bits(old + loadShareWeight*(share-old)))
}

// replicas is the estimated number of picker replicas sharing the pool's
// streams: the inverse of the replica's share of the load, rounded, from
// 1 to maxReplicaEstimate (1 before any sample).
func (x *prefixIndex) replicas() int {
	if !x.hasLoadShare.Load() {
		return 1
	}
	share := math.Float64frombits(x.loadShare.Load())
	if share*maxReplicaEstimate <= 1 {
		return maxReplicaEstimate
	}
	return min(max(int(math.Round(1/share)), 1), maxReplicaEstimate)
}

// missShareWeight is the weight of one report in the pool's moving
// average of uncached prompt tokens: about the last hundred requests.
const missShareWeight = 0.01

// observeMiss folds one report into the pool's share of uncached tokens.
// Reports race; a lost update of a moving average does not matter.
func (x *prefixIndex) observeMiss(share float64) {
	if !x.hasMissShare.Load() {
		x.missShare.Store(math.Float64bits(share))
		x.hasMissShare.Store(true)
		return
	}
	old := math.Float64frombits(x.missShare.Load())
	x.missShare.Store(math.Float64bits(old + missShareWeight*(share-old)))
}

// tokenScaleWeight is the weight of one report in the pool's moving
// average of the servers' tokens over the estimate: a few dozen requests.
const tokenScaleWeight = 0.05

// observeTokenScale folds the scale of one whole prompt's report into the
// pool's. Reports race; a lost update of a moving average does not matter.
func (x *prefixIndex) observeTokenScale(scale float64) {
	if !x.hasTokenScale.Load() {
		x.tokenScale.Store(math.Float64bits(scale))
		x.hasTokenScale.Store(true)
		return
	}
	old := math.Float64frombits(x.tokenScale.Load())
	x.tokenScale.Store(math.Float64bits(old + tokenScaleWeight*(scale-old)))
}

// recentTokenScale is the pool's recent scale of the servers' tokens over
// the estimate (1, the estimate itself, before any report).
func (x *prefixIndex) recentTokenScale() float64 {
	if !x.hasTokenScale.Load() {
		return 1
	}
	return math.Float64frombits(x.tokenScale.Load())
}

// recentMissShare is the pool's recent share of uncached prompt tokens
// (0 before any report).
func (x *prefixIndex) recentMissShare() float64 {
	return math.Float64frombits(x.missShare.Load())
}

// alignedView maps positions of an EndpointSet to endpoint states (nil
// where an endpoint has none); immutable.
type alignedView struct {
	set     framework.EndpointSet
	version uint64
	states  []*prefixEndpoint
}

// statesFor returns the endpoint states aligned with set.
func (x *prefixIndex) statesFor(set framework.EndpointSet) []*prefixEndpoint {
	version := x.version.Load()
	if v := x.aligned.Load(); v != nil && v.set == set && v.version == version {
		return v.states
	}
	// Read the version before the map: a change in between leaves a view
	// marked older than its contents, which the next call rebuilds.
	m := *x.endpoints.Load()
	v := &alignedView{set: set, version: version, states: make([]*prefixEndpoint, set.Len())}
	for i, e := range framework.All(set) {
		v.states[i] = m[e.Key()]
	}
	x.aligned.Store(v)
	return v.states
}

type indexShard struct {
	mu sync.RWMutex
	m  map[uint64]holders
	// Keep neighbouring shards' locks off one cache line.
	_ [64]byte
}

// holders are the endpoints holding one block. Usually one, stored inline;
// the others sit behind a pointer so the map value stays 16 bytes (the map
// has an entry per cached block: its size is the index's size).
type holders struct {
	first *prefixEndpoint
	more  *[]*prefixEndpoint
}

func (hs *holders) rest() []*prefixEndpoint {
	if hs.more == nil {
		return nil
	}
	return *hs.more
}

// prefixEndpoint is one endpoint's LRU of block hashes.
type prefixEndpoint struct {
	key framework.EndpointKey
	// pool and endpoint name the endpoint to peer replicas (ForgetBlocks).
	pool     framework.Pool
	endpoint framework.Endpoint
	// slot numbers the endpoint within its pool's index, for per-cycle
	// arrays; immutable, and reused only after the endpoint's blocks have
	// left the index.
	slot int32
	idx  *prefixIndex

	// live is the LRU's live blocks (blockLRU.liveBlocks) as of its last
	// change, read without mu by scoring (Params.QueueCostTokensWithRoom).
	live atomic.Int64

	// dead is set, under mu, when the endpoint left the pool; read without
	// mu by scoring, to skip a stale view's entry.
	dead atomic.Bool

	// sampledAt is the scrape time (Unix ns) of the server's metrics
	// snapshot the LRU was last aged by (observeSample); read without mu,
	// to skip a sample already seen.
	sampledAt atomic.Int64

	mu       sync.Mutex
	lru      *blockLRU
	capacity int
	// charged is the blocks this endpoint holds of its pool's share of the
	// index memory budget (settle).
	charged int64
	// computed is the server's count of prompt tokens it computed (its
	// prefix-cache queries less hits) at sample; hasComputed is false
	// until a sample carried the counters.
	computed    float64
	hasComputed bool
	// added counts the blocks this index added since sample, corrected by
	// the servers' reports of cached tokens; pending is the blocks the
	// server computed beyond them, not yet aged by (less than one, or
	// negative: this index's adds the server has yet to count, or blocks
	// it already had from another replica's requests).
	added   float64
	pending float64
}

// heldBlocks is the blocks the endpoint's LRU holds, its phantoms
// included: what the index believes its server caches.
func (pe *prefixEndpoint) heldBlocks() int {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return len(pe.lru.pos) + pe.lru.phantomBlocks
}

// correctAdded adds to the blocks counted as this index's since the last
// sample the difference the server's report of the request's cached
// tokens made (ObserveCachedTokens), in blocks.
func (pe *prefixEndpoint) correctAdded(blocks float64) {
	pe.mu.Lock()
	pe.added += blocks
	pe.mu.Unlock()
}

// observeSample ages the endpoint's LRU by the blocks its server cached
// since the previous sample for requests this index did not record: the
// growth of the server's computed prompt tokens (prefix-cache queries less
// hits), in blocks of tokensPerBlock, less the blocks recorded here. So
// the LRU evicts at the rate the server's cache does, however many picker
// replicas share the server. A sample without the counters, or whose
// counters fell (the server restarted), only sets the base for the next.
func (pe *prefixEndpoint) observeSample(m framework.Metrics, tokensPerBlock float64) {
	if m.IsZero() {
		return
	}
	at := m.ScrapedAt().UnixNano()
	if at <= pe.sampledAt.Load() {
		return
	}
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.dead.Load() || at <= pe.sampledAt.Load() {
		return // dead, raced, or an older snapshot read before a newer one
	}
	pe.sampledAt.Store(at)
	added := pe.added
	pe.added = 0
	computed := m.PrefixCacheQueries() - m.PrefixCacheHits()
	if m.PrefixCacheQueries() <= 0 || !pe.hasComputed || computed < pe.computed {
		pe.computed, pe.hasComputed, pe.pending = computed, m.PrefixCacheQueries() > 0, 0
		return
	}
	pe.pending += (computed-pe.computed)/tokensPerBlock - added
	pe.computed = computed
	// A debt of more than the cache is not one this index can still owe:
	// bound it, so that a long stretch of blocks the server already had
	// does not stop the aging for as long.
	pe.pending = max(pe.pending, -float64(pe.capacity))
	if pe.pending >= 1 {
		n := math.Floor(pe.pending)
		pe.pending -= n
		pe.lru.age(int(min(n, float64(pe.capacity))))
		pe.publishLive()
	}
}

// chargeQuantum is the blocks an endpoint takes from or gives back to its
// pool's share at a time, so that a pick does not take the budget's lock
// for every few blocks.
const chargeQuantum = 1024

// settle brings the endpoint's charge to the index memory budget in line
// with the blocks its LRU holds: more is asked of the pool's share as the
// LRU grows, and where the share has no more, the endpoint keeps what it
// was granted and its least recent blocks go; what it no longer needs is
// given back. Called with pe.mu held, after each change of the LRU.
func (pe *prefixEndpoint) settle() {
	defer pe.publishLive()
	share := pe.idx.share
	if share == nil || pe.lru == nil || pe.idx.released.Load() {
		return
	}
	n := int64(len(pe.lru.pos))
	switch {
	case n > pe.charged:
		need := n - pe.charged
		if rounded := (need + chargeQuantum - 1) / chargeQuantum * chargeQuantum; share.Acquire(rounded) == nil {
			pe.charged += rounded
		} else if share.Acquire(need) == nil {
			pe.charged += need
		} else {
			pe.lru.trimBlocksTo(int(pe.charged))
		}
	case pe.charged-n >= 2*chargeQuantum:
		keep := (n + chargeQuantum - 1) / chargeQuantum * chargeQuantum
		share.Release(pe.charged - keep)
		pe.charged = keep
	}
}

// publishLive copies the LRU's count of live blocks for scoring. Called
// with pe.mu held.
func (pe *prefixEndpoint) publishLive() {
	if pe.lru != nil {
		pe.live.Store(int64(pe.lru.liveBlocks))
	}
}

// releaseCharge gives back all the endpoint's charge. Called with pe.mu
// held, when its LRU goes.
func (pe *prefixEndpoint) releaseCharge() {
	if pe.charged != 0 {
		pe.idx.share.Release(pe.charged)
		pe.charged = 0
	}
}

func newPrefixIndex(share *fairshare.Party) *prefixIndex {
	x := &prefixIndex{share: share}
	for i := range x.shards {
		x.shards[i].m = make(map[uint64]holders)
	}
	empty := map[framework.EndpointKey]*prefixEndpoint{}
	x.endpoints.Store(&empty)
	return x
}

// lookup returns the endpoint's LRU state, or nil when it has none.
func (x *prefixIndex) lookup(key framework.EndpointKey) *prefixEndpoint {
	return (*x.endpoints.Load())[key]
}

// endpointFor returns e's state, creating it when e is still in the pool.
// It returns nil for an endpoint that left the pool (or a removed pool), so
// a pick racing a removal leaves nothing behind.
func (x *prefixIndex) endpointFor(pool framework.Pool, e framework.Endpoint, capacity int) *prefixEndpoint {
	key := e.Key()
	if pe := x.lookup(key); pe != nil {
		return pe
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.removed {
		return nil
	}
	cur := *x.endpoints.Load()
	if pe := cur[key]; pe != nil {
		return pe
	}
	// The pool swaps its endpoint set before it tells observers, and the
	// observer takes mu: if e is still in the set here, its removal (if
	// any) is yet to be heard and will find this state.
	if now, ok := pool.Endpoints().Get(e.Address()); !ok || now.Key() != key {
		return nil
	}
	pe := &prefixEndpoint{key: key, pool: pool, endpoint: e, idx: x, capacity: capacity}
	if n := len(x.freeSlots); n > 0 {
		pe.slot = x.freeSlots[n-1]
		x.freeSlots = x.freeSlots[:n-1]
	} else {
		pe.slot = x.slots.Load()
		x.slots.Store(pe.slot + 1)
	}
	pe.lru = newBlockLRU(capacity, func(h uint64) { x.removeHolder(h, pe) })
	next := make(map[framework.EndpointKey]*prefixEndpoint, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[key] = pe
	x.endpoints.Store(&next)
	x.version.Add(1)
	return pe
}

// drop forgets endpoints that left the pool: their LRUs and every index
// entry that names them. Called by the registry's observer with the pool's
// writer lock held, so it is quick: the index is swept once per shard, not
// once per block, and mu (which a pick of a new endpoint needs) is not held
// while sweeping.
func (x *prefixIndex) drop(removed []framework.Endpoint) {
	x.mu.Lock()
	cur := *x.endpoints.Load()
	var gone []*prefixEndpoint
	for _, e := range removed {
		if pe := cur[e.Key()]; pe != nil {
			gone = append(gone, pe)
		}
	}
	if len(gone) == 0 {
		x.mu.Unlock()
		return
	}
	next := make(map[framework.EndpointKey]*prefixEndpoint, len(cur))
	for k, v := range cur {
		next[k] = v
	}
	for _, pe := range gone {
		delete(next, pe.key)
	}
	x.endpoints.Store(&next)
	x.version.Add(1)
	x.mu.Unlock()

	for _, pe := range gone {
		pe.mu.Lock()
		pe.dead.Store(true) // no record after this
		keys := pe.lru.keys()
		pe.lru = nil // freed whole; its eviction callback would sweep per block
		pe.releaseCharge()
		pe.mu.Unlock()
		x.sweep(pe, keys)
	}
	// Slots are reused only now, when no index entry names the dead states.
	x.mu.Lock()
	for _, pe := range gone {
		x.freeSlots = append(x.freeSlots, pe.slot)
	}
	x.mu.Unlock()
}

// sweep removes pe from the holders of its blocks, one shard lock at a time.
func (x *prefixIndex) sweep(pe *prefixEndpoint, keys []uint64) {
	// Group the keys by shard (a counting sort) so each shard is locked once.
	var start [prefixShards + 1]int
	for _, h := range keys {
		start[h&(prefixShards-1)+1]++
	}
	for s := 1; s <= prefixShards; s++ {
		start[s] += start[s-1]
	}
	grouped := make([]uint64, len(keys))
	fill := start
	for _, h := range keys {
		s := h & (prefixShards - 1)
		grouped[fill[s]] = h
		fill[s]++
	}
	for s := range x.shards {
		sh := &x.shards[s]
		sh.mu.Lock()
		for _, h := range grouped[start[s]:start[s+1]] {
			removeHolderLocked(sh, h, pe)
		}
		sh.mu.Unlock()
	}
}

// markRemoved stops the index from growing once its pool is gone, and
// gives back its endpoints' charges to the memory budget (the index itself
// goes with its last reader).
func (x *prefixIndex) markRemoved() {
	x.mu.Lock()
	x.removed = true
	x.mu.Unlock()
	if x.share == nil {
		return
	}
	x.released.Store(true) // no settle charges after this
	for _, pe := range *x.endpoints.Load() {
		pe.mu.Lock()
		pe.releaseCharge()
		pe.mu.Unlock()
	}
}

// record notes that the endpoint now caches the blocks. Earlier blocks are
// touched last, so they are the most recently used: an LRU that evicts the
// start of a prompt loses the whole prefix, one that evicts its tail loses
// only the tail.
//
// It returns the stamp the last of the first predicted blocks had before
// (0 when predicted is 0 or it was not held): if the server then reports
// that it did not have them, every block used before it is gone too
// (dropUsedBefore).
func (pe *prefixEndpoint) record(hashes []uint64, capacity, predicted int) (watermark uint64) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	defer pe.settle()
	if pe.dead.Load() {
		return 0
	}
	if predicted > 0 && predicted <= len(hashes) {
		// Each prompt touches its whole chain, its earlier blocks last, so
		// the last predicted block is the least recent of them.
		watermark, _ = pe.lru.stampOf(hashes[predicted-1])
	}
	if capacity != pe.capacity {
		pe.lru.resize(capacity)
		pe.capacity = capacity
	}
	if predicted > 0 && predicted <= len(hashes) {
		pe.lru.markLive(hashes[:predicted])
	}
	// A prompt usually starts with blocks this endpoint used last (a
	// conversation's next turn, a shared system prompt, a retry): they
	// are already the most recent, in order, and only need to stay ahead
	// of the rest, so they move as one run instead of one lookup each.
	run, first, last := pe.lru.frontRun(hashes)
	if run == len(hashes) {
		return watermark // already the most recent, in order
	}
	evictions := pe.lru.evictions
	pe.touchOrAdd(hashes[run:])
	// The run is intact unless an add evicted from it (its positions may
	// be reused) or the rest of the prompt repeats one of its blocks.
	if run > 0 && pe.lru.evictions == evictions && pe.lru.isRun(hashes[:run], first, last) {
		pe.lru.moveRunToFront(first, last)
		return watermark
	}
	pe.touchOrAdd(hashes[:run])
	return watermark
}

// forgetUsedBefore drops the blocks used less recently than watermark: the
// server reported it no longer had a block of that age, and its cache
// evicts the least recently used first. The blocks touched since (the
// request's own, which the server has just computed) stay. With dropped
// non-nil, the blocks dropped are appended to it, the least recent first.
func (pe *prefixEndpoint) forgetUsedBefore(watermark uint64, dropped *[]uint64) int {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.dead.Load() || watermark == 0 {
		return 0
	}
	defer pe.settle()
	return pe.lru.dropUsedBefore(watermark, dropped)
}

// forget drops the blocks named, those held: a peer replica's server
// report said the endpoint no longer has them. Only ever fewer beliefs:
// a block this LRU holds that the peer's did not stays, and a prompt whose
// leading blocks go scores nothing here however much of its tail stays.
func (pe *prefixEndpoint) forget(blocks []uint64) int {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.dead.Load() {
		return 0
	}
	defer pe.settle()
	n := 0
	for _, h := range blocks {
		if pe.lru.remove(h) {
			n++
		}
	}
	return n
}

// touchOrAdd makes the blocks the most recent, the first the most recent
// of all, adding those not held.
func (pe *prefixEndpoint) touchOrAdd(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if pe.lru.touch(h) {
			continue
		}
		pe.lru.add(h)
		pe.added++
		pe.idx.addHolder(h, pe)
	}
}

func (x *prefixIndex) shard(h uint64) *indexShard { return &x.shards[h&(prefixShards-1)] }

func (x *prefixIndex) addHolder(h uint64, pe *prefixEndpoint) {
	sh := x.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	hs := sh.m[h]
	switch {
	case hs.first == nil:
		hs.first = pe
	case hs.first == pe || slices.Contains(hs.rest(), pe):
		return
	case hs.more == nil:
		hs.more = &[]*prefixEndpoint{pe}
	default:
		*hs.more = append(*hs.more, pe)
	}
	sh.m[h] = hs
}

func (x *prefixIndex) removeHolder(h uint64, pe *prefixEndpoint) {
	sh := x.shard(h)
	sh.mu.Lock()
	removeHolderLocked(sh, h, pe)
	sh.mu.Unlock()
}

func removeHolderLocked(sh *indexShard, h uint64, pe *prefixEndpoint) {
	hs, ok := sh.m[h]
	if !ok {
		return
	}
	rest := hs.rest()
	if hs.first == pe {
		if len(rest) == 0 {
			delete(sh.m, h)
			return
		}
		hs.first = rest[len(rest)-1]
		rest = rest[:len(rest)-1]
	} else if i := slices.Index(rest, pe); i >= 0 {
		rest[i] = rest[len(rest)-1]
		rest = rest[:len(rest)-1]
	} else {
		return
	}
	if len(rest) == 0 {
		hs.more = nil
	} else {
		clear((*hs.more)[len(rest):])
		*hs.more = rest
	}
	sh.m[h] = hs
}

// match computes, for each endpoint slot, how many leading blocks of hashes
// it holds, into matched (zeroed, indexed by slot); it returns the longest.
// scratch is reused between calls.
//
// It looks up a few blocks, not every one, because what an endpoint holds
// of a prompt is a prefix: record touches a prompt's blocks last to first,
// so an endpoint's earlier blocks are always more recent in its LRU than
// its later ones and are evicted after them; and a block's hash is chained
// from every block before it. So the holders of block i are a subset of
// the holders of block i-1, and an endpoint's match is one past the last
// block it holds. match bisects for where the holder sets shrink: a
// prompt held whole by the same endpoints costs two lookups, not one per
// block, and each endpoint whose prefix ends inside costs about log2(blocks)
// more.
func (x *prefixIndex) match(hashes []uint64, matched []int32, scratch *[]int32) int {
	n := len(hashes)
	if n == 0 {
		return 0
	}
	buf := (*scratch)[:0]
	defer func() { *scratch = buf[:0] }()
	probe := func(i int) []int32 {
		start := len(buf)
		buf = x.appendHolders(buf, hashes[i])
		set := buf[start:len(buf):len(buf)]
		for _, slot := range set {
			if int(slot) < len(matched) {
				matched[slot] = max(matched[slot], int32(i)+1)
			}
		}
		return set
	}
	first := probe(0)
	if len(first) == 0 || n == 1 {
		return longestMatch(matched, first)
	}
	last := probe(n - 1)
	// Holders of block l (hl) and block r (hr) are known; find where, in
	// between, the holders that are in hl and not in hr stop.
	var split func(l int, hl []int32, r int, hr []int32)
	split = func(l int, hl []int32, r int, hr []int32) {
		if r-l <= 1 || len(hl) == 0 || sameSlots(hl, hr) {
			return
		}
		m := (l + r) / 2
		hm := probe(m)
		split(l, hl, m, hm)
		split(m, hm, r, hr)
	}
	split(0, first, n-1, last)
	return longestMatch(matched, first)
}

// appendHolders appends the slots of the endpoints holding block h.
func (x *prefixIndex) appendHolders(dst []int32, h uint64) []int32 {
	sh := x.shard(h)
	sh.mu.RLock()
	hs := sh.m[h]
	if hs.first != nil {
		dst = append(dst, hs.first.slot)
		for _, pe := range hs.rest() {
			dst = append(dst, pe.slot)
		}
	}
	sh.mu.RUnlock()
	return dst
}

// sameSlots reports whether a and b hold the same slots (each set has no
// duplicates; they are a handful long).
func sameSlots(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// longestMatch is the longest match of the holders of the first block;
// endpoints that do not hold it match nothing.
func longestMatch(matched []int32, first []int32) int {
	longest := 0
	for _, slot := range first {
		if int(slot) < len(matched) {
			longest = max(longest, int(matched[slot]))
		}
	}
	return longest
}
