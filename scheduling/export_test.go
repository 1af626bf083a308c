// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"context"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// Views into the prefix scorers' state, for tests.

func (s *Scheduler) prefixScorers() []*prefix.Scorer {
	var out []*prefix.Scorer
	for _, p := range s.built.plugins {
		if ps, ok := p.(*prefix.Scorer); ok {
			out = append(out, ps)
		}
	}
	return out
}

// prefixBlocks counts the distinct blocks indexed for the pool.
func (s *Scheduler) prefixBlocks(pool *datastore.Pool) int {
	n := 0
	for _, ps := range s.prefixScorers() {
		n += ps.IndexedBlocks(framework.PoolOf(pool))
	}
	return n
}

// prefixHolds reports whether any index entry or LRU of the pool names e.
func (s *Scheduler) prefixHolds(pool *datastore.Pool, e *datastore.Endpoint) bool {
	for _, ps := range s.prefixScorers() {
		if ps.Holds(framework.PoolOf(pool), framework.EndpointOf(e)) {
			return true
		}
	}
	return false
}

// prefixPools counts the pools with a prefix index.
func (s *Scheduler) prefixPools() int {
	n := 0
	for _, ps := range s.prefixScorers() {
		n += ps.IndexedPools()
	}
	return n
}

// Schedule is ScheduleDeferred with its post-pick step run before it
// returns, as a caller that commits at once does.
func (s *Scheduler) Schedule(ctx context.Context, pool *datastore.Pool, req *Request) (*Result, error) {
	res, err := s.ScheduleDeferred(ctx, pool, req)
	res.Commit()
	return res, err
}
