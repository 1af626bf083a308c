// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"slices"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Batching: the records of the picks made since the last flush, packed
// into frames and fanned out to every peer's queue.

// queueBlocks queues a record of blocks for the next flush.
func (x *Exchange) queueBlocks(kind byte, pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	r := record{kind: kind, pool: pool.Key(), addr: e.Address(), blocks: slices.Clone(blocks[:min(len(blocks), MaxBlocksPerRecord)])}
	if !validRecord(&r) {
		return
	}
	x.mu.Lock()
	if len(x.pending) >= x.opts.QueueRecords {
		x.mu.Unlock()
		x.metrics.dropped.WithLabelValues("queue").Inc()
		return
	}
	x.pending = append(x.pending, r)
	x.mu.Unlock()
	x.wake()
}

func (x *Exchange) wake() {
	select {
	case x.kick <- struct{}{}:
	default:
	}
}

// flushLoop sends the gathered records when there are some, at most every
// FlushInterval, and the in-flight snapshot every SnapshotInterval.
func (x *Exchange) flushLoop(ctx context.Context) {
	snap := time.NewTicker(x.opts.SnapshotInterval)
	defer snap.Stop()
	batch := time.NewTimer(0)
	<-batch.C
	for {
		select {
		case <-ctx.Done():
			batch.Stop()
			return
		case <-snap.C:
			x.fanOut(framesOf(x.snapshotFrames(), false))
			continue
		case <-x.kick:
		}
		batch.Reset(x.opts.FlushInterval)
		select {
		case <-ctx.Done():
			batch.Stop()
			return
		case <-batch.C:
		}
		x.fanOut(x.pendingFrames())
	}
}

// pendingFrames takes the gathered records and encodes them: the forget
// records in frames of their own, which go only to the peers that read
// them.
func (x *Exchange) pendingFrames() []frame {
	x.mu.Lock()
	recs := x.pending
	x.pending = nil
	for e, pool := range x.dirty {
		recs = append(recs, record{kind: kindInFlight, pool: pool, addr: e.Address, inFlight: e.OwnInFlight()})
		x.reported[e] = pool
		delete(x.dirty, e)
	}
	x.mu.Unlock()
	// In order, so that a peer forgets and learns a block as this replica
	// did: each run of forget records, and each run of others, is framed
	// on its own.
	var frames []frame
	for len(recs) > 0 {
		forget := recs[0].kind == kindForget
		n := 1
		for n < len(recs) && (recs[n].kind == kindForget) == forget {
			n++
		}
		frames = append(frames, framesOf(x.encode(recs[:n]), forget)...)
		recs = recs[n:]
	}
	return frames
}

// frame is an encoded frame on its way to the peers; forget frames go
// only to the peers that read them.
type frame struct {
	b      []byte
	forget bool
}

func framesOf(bs [][]byte, forget bool) []frame {
	out := make([]frame, len(bs))
	for i, b := range bs {
		out[i] = frame{b: b, forget: forget}
	}
	return out
}

// snapshotFrames encodes the in-flight count of every endpoint reported
// nonzero since the last snapshot; those now at zero are sent once more
// and then no longer.
func (x *Exchange) snapshotFrames() [][]byte {
	x.mu.Lock()
	recs := make([]record, 0, len(x.reported))
	for e, pool := range x.reported {
		n := e.OwnInFlight()
		recs = append(recs, record{kind: kindInFlight, pool: pool, addr: e.Address, inFlight: n})
		if n <= 0 {
			delete(x.reported, e)
		}
	}
	x.mu.Unlock()
	return x.encode(recs)
}

// encode packs records into frames of at most MaxFrameBytes.
func (x *Exchange) encode(recs []record) [][]byte {
	var frames [][]byte
	var b []byte
	for i := range recs {
		if !validRecord(&recs[i]) {
			continue
		}
		start := len(b)
		if b == nil {
			b = append(b, frameHeader...)
			start = len(frameHeader)
		}
		b = appendRecord(b, &recs[i])
		if len(b) > x.opts.MaxFrameBytes && start > len(frameHeader) {
			frames = append(frames, b[:start:start])
			b = append(append([]byte{}, frameHeader...), b[start:]...)
		}
	}
	if len(b) > len(frameHeader) {
		frames = append(frames, b)
	}
	x.metrics.sent.Add(float64(len(recs)))
	return frames
}

// fanOut queues the frames to every peer; a peer whose queue is full
// misses them (and they are counted).
func (x *Exchange) fanOut(frames []frame) {
	if len(frames) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.peers {
		for _, f := range frames {
			select {
			case p.frames <- f:
			default:
				x.metrics.dropped.WithLabelValues("peer-queue").Inc()
			}
		}
	}
}
