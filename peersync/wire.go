// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/poolpicker/poolpicker/datastore"
)

// frameVersion is the first byte of every frame: a receiver refuses a
// frame of another version (a peer of another release) whole, rather than
// reading records it would misparse.
const frameVersion = 1

// Record kinds.
const (
	kindBlocks   = 1 // the endpoint now caches these prompt blocks
	kindInFlight = 2 // the sender has this many requests in flight there
	// kindForget: the endpoint no longer caches these prompt blocks (its
	// server reported a miss). Sent only on streams whose receiver said it
	// reads them (forgetHeader): a receiver of the release before refuses a
	// frame with a kind it does not know.
	kindForget = 3
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

// appendRecord appends r's encoding: kind, the pool's namespace and name
// and the endpoint's address (each a length byte and the bytes), then the
// blocks (a uvarint count and 8 little-endian bytes each) or the count in
// flight (a uvarint). A forget record is laid out as a blocks record.
func appendRecord(b []byte, r *record) []byte {
	b = append(b, r.kind)
	for _, s := range []string{r.pool.Namespace, r.pool.Name, r.addr} {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	switch r.kind {
	case kindBlocks, kindForget:
		b = binary.AppendUvarint(b, uint64(len(r.blocks)))
		for _, h := range r.blocks {
			b = binary.LittleEndian.AppendUint64(b, h)
		}
	case kindInFlight:
		b = binary.AppendUvarint(b, uint64(max(r.inFlight, 0)))
	}
	return b
}

// validRecord reports whether r fits the wire's bounds (a sender skips one
// that does not: names the API server would refuse, a prompt longer than
// any profile hashes).
func validRecord(r *record) bool {
	return len(r.pool.Namespace) <= maxNameBytes && len(r.pool.Name) <= maxNameBytes && len(r.addr) <= maxAddrBytes &&
		len(r.blocks) <= MaxBlocksPerRecord
}

var errTruncated = errors.New("truncated record")

// decodeFrame calls fn for each record of frame, in order; it stops at the
// first malformed record and returns why. The blocks fn gets alias a
// buffer reused for the next record.
func decodeFrame(frame []byte, fn func(*record)) error {
	if len(frame) == 0 {
		return errors.New("empty frame")
	}
	if frame[0] != frameVersion {
		return fmt.Errorf("frame version %d, want %d", frame[0], frameVersion)
	}
	b := frame[1:]
	var r record
	var blocks []uint64
	for len(b) > 0 {
		r.kind, b = b[0], b[1:]
		if r.kind != kindBlocks && r.kind != kindInFlight && r.kind != kindForget {
			return fmt.Errorf("unknown record kind %d", r.kind)
		}
		var fields [3]string
		for i, limit := range []int{maxNameBytes, maxNameBytes, maxAddrBytes} {
			if len(b) == 0 {
				return errTruncated
			}
			n := int(b[0])
			if n > limit || len(b) < 1+n {
				return fmt.Errorf("field of %d bytes: %w", n, errTruncated)
			}
			fields[i], b = string(b[1:1+n]), b[1+n:]
		}
		r.pool = datastore.PoolKey{Namespace: fields[0], Name: fields[1]}
		r.addr = fields[2]
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return errTruncated
		}
		b = b[n:]
		switch r.kind {
		case kindBlocks, kindForget:
			if v > MaxBlocksPerRecord {
				return fmt.Errorf("%d blocks in a record, at most %d", v, MaxBlocksPerRecord)
			}
			if uint64(len(b)) < 8*v {
				return errTruncated
			}
			blocks = blocks[:0]
			for i := uint64(0); i < v; i++ {
				blocks = append(blocks, binary.LittleEndian.Uint64(b[8*i:]))
			}
			b = b[8*v:]
			r.blocks, r.inFlight = blocks, 0
		case kindInFlight:
			r.blocks, r.inFlight = nil, int64(min(v, MaxInFlightBound))
		}
		fn(&r)
	}
	return nil
}
