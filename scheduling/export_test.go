package scheduling

import "github.com/poolpicker/poolpicker/datastore"

// Views into the prefix scorers' state, for tests.

// prefixBlocks counts the distinct blocks indexed for the pool.
func (s *Scheduler) prefixBlocks(pool *datastore.Pool) int {
	n := 0
	for _, ps := range s.prefixScorers() {
		if v, ok := ps.indexes.Load(pool); ok {
			n += v.(*prefixIndex).blocks()
		}
	}
	return n
}

// prefixHolds reports whether any index entry or LRU of the pool names e.
func (s *Scheduler) prefixHolds(pool *datastore.Pool, e *datastore.Endpoint) bool {
	for _, ps := range s.prefixScorers() {
		v, ok := ps.indexes.Load(pool)
		if !ok {
			continue
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
	}
	return false
}

// prefixPools counts the pools with a prefix index.
func (s *Scheduler) prefixPools() int {
	n := 0
	for _, ps := range s.prefixScorers() {
		ps.indexes.Range(func(_, _ any) bool { n++; return true })
	}
	return n
}
