// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
)

// Record kinds, as the wire names them (wirepb.Record_Kind).
const (
	kindBlocks   = byte(wirepb.Record_BLOCKS)    // the endpoint now caches these prompt blocks
	kindInFlight = byte(wirepb.Record_IN_FLIGHT) // the sender has this many requests in flight there
	// kindForget: the endpoint no longer caches these prompt blocks (its
	// server reported a miss). Sent only on streams whose receiver said it
	// reads them (forgetHeader).
	kindForget = byte(wirepb.Record_FORGET)
)

// Bounds of what a record may carry: beyond them a frame is refused.
const (
	maxNameBytes = 253 // a Kubernetes name (and a namespace, at most 63)
	maxAddrBytes = 64  // an ip:port, IPv6 included
	// MaxBlocksPerRecord bounds the blocks of one pick: a prompt's hashed
	// blocks are at most the prefix scorer's maxPrefixBlocksToMatch, which
	// the receiver applies again.
	MaxBlocksPerRecord = 1 << 12
	// MaxInFlightBound bounds an in-flight count on the wire; the
	// receiver's Options.MaxInFlightPerEndpoint, at most this, bounds it
	// further.
	MaxInFlightBound = 1 << 16
)

// record is one observation of the sender's.
type record struct {
	kind     byte
	pool     datastore.PoolKey
	addr     string
	blocks   []uint64 // kindBlocks, kindForget
	inFlight int64    // kindInFlight
}

// frameHeader begins every frame: its version (wirepb.Frame.version), so
// that a receiver refuses a frame of another release whole rather than
// misread it. Alone it is a heartbeat.
var frameHeader = slices.Clip(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(wirepb.FrameVersion_FRAME_VERSION)))

// appendRecord appends r as one of a wirepb.Frame's records, so that a
// frame is built record by record up to its size bound.
func appendRecord(b []byte, r *record) []byte {
	m := wirepb.Record{Kind: wirepb.Record_Kind(r.kind), Namespace: r.pool.Namespace, Name: r.pool.Name, Address: r.addr}
	switch r.kind {
	case kindBlocks, kindForget:
		m.Blocks = r.blocks
	case kindInFlight:
		m.InFlight = uint32(min(max(r.inFlight, 0), MaxInFlightBound))
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(proto.Size(&m)))
	b, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, &m) // a Record always marshals
	return b
}

// validRecord reports whether r fits the wire's bounds (a sender skips one
// that does not: names the API server would refuse, a prompt longer than
// any profile hashes).
func validRecord(r *record) bool {
	return len(r.pool.Namespace) <= maxNameBytes && len(r.pool.Name) <= maxNameBytes && len(r.addr) <= maxAddrBytes &&
		len(r.blocks) <= MaxBlocksPerRecord
}

// decodeFrame calls fn for each record of frame, in order, once the whole
// frame has parsed; it stops at the first record beyond the wire's bounds
// and returns why. The record fn gets is reused for the next.
func decodeFrame(frame []byte, fn func(*record)) error {
	var f wirepb.Frame
	if err := proto.Unmarshal(frame, &f); err != nil {
		return fmt.Errorf("malformed frame: %w", err)
	}
	if f.Version != uint32(wirepb.FrameVersion_FRAME_VERSION) {
		return fmt.Errorf("frame version %d, want %d", f.Version, wirepb.FrameVersion_FRAME_VERSION)
	}
	var r record
	for _, m := range f.Records {
		r = record{kind: byte(m.Kind), pool: datastore.PoolKey{Namespace: m.Namespace, Name: m.Name}, addr: m.Address}
		switch r.kind {
		case kindBlocks, kindForget:
			r.blocks = m.Blocks
		case kindInFlight:
			r.inFlight = int64(min(m.InFlight, MaxInFlightBound))
		default:
			return fmt.Errorf("unknown record kind %d", m.Kind)
		}
		if len(r.blocks) > MaxBlocksPerRecord {
			return fmt.Errorf("%d blocks in a record, at most %d", len(r.blocks), MaxBlocksPerRecord)
		}
		if !validRecord(&r) {
			return fmt.Errorf("a record's names are longer than the API server allows (%d, %d and %d bytes)", len(m.Namespace), len(m.Name), len(m.Address))
		}
		fn(&r)
	}
	return nil
}
