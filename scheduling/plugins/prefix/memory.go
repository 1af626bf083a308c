// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"context"

	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/kvevents"
)

// MemoryLimitName names the process's prefix-index budget in the fair-share
// metrics (label limit of poolpicker_fair_share_*): what each pool's
// indexes hold of it, in blocks of 128 bytes.
const MemoryLimitName = "prefix_index_blocks"

// MemoryFlag is the command's flag that sizes the process's budget, named
// in a pool's refusals.
const MemoryFlag = "prefix-index-max-bytes"

// Memory is the process's prefix-index memory budget, in blocks of 128
// bytes: one fairshare.Limit shared by every prefix-cache scorer instance
// (the learned index of a precise scorer included) and by the precise
// scorers' KV-event indexes, fairly between namespaces and their pools. It
// is a prometheus.Collector of each pool's share.
type Memory struct {
	*fairshare.Limit
}

// NewMemory returns a budget of maxBytes (zero: DefaultMaxIndexBytes;
// negative: no bound, only counted), with reservePercent of it kept for
// pools that hold none yet (fairshare.Options.ReservePercent).
func NewMemory(maxBytes int64, reservePercent int) *Memory {
	if maxBytes == 0 {
		maxBytes = DefaultMaxIndexBytes
	}
	return &Memory{fairshare.New(fairshare.Options{Name: MemoryLimitName, Flag: MemoryFlag, Unit: "blocks",
		Capacity: maxBytes / indexBytesPerBlock, ReservePercent: reservePercent})}
}

type memoryKey struct{}

// WithMemory returns ctx carrying m: the scorers built with a Handle whose
// Context it is share m unless their maxIndexBytes sets a budget of their
// own. The command sets it on the scheduler's base context.
func WithMemory(ctx context.Context, m *Memory) context.Context {
	return context.WithValue(ctx, memoryKey{}, m)
}

// memoryOf is the budget ctx carries, nil when none.
func memoryOf(ctx context.Context) *Memory {
	m, _ := ctx.Value(memoryKey{}).(*Memory)
	return m
}

// eventBudget is a KV-event index's share of the budget: each endpoint
// reserves its blocks from its pool's account (kvevents.PoolBudget).
type eventBudget struct{ limit *fairshare.Limit }

var _ kvevents.PoolBudget = eventBudget{}

// Reserve charges blocks of no pool against the capacity alone.
func (b eventBudget) Reserve(n int) bool { return b.limit.Unshared().AcquireUnshared(int64(n)) }

// Release gives back blocks of no pool.
func (b eventBudget) Release(n int) { b.limit.Unshared().Release(int64(n)) }

// ForPool is the account of the pool's event-index blocks.
func (b eventBudget) ForPool(namespace, pool string) kvevents.Budget {
	return partyBudget{b.limit.Party(namespace, pool)}
}

type partyBudget struct{ p *fairshare.Party }

func (b partyBudget) Reserve(n int) bool { return b.p.Acquire(int64(n)) == nil }
func (b partyBudget) Release(n int)      { b.p.Release(int64(n)) }
