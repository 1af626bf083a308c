// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"testing"
)

// FuzzDecodeFrame: whatever a peer sends, decoding returns or fails
// without a panic, reads no record beyond the wire's bounds, and a frame
// behind a tag opens only for the session that sealed it.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(encodeFrame(record{kind: kindBlocks, pool: poolKey, addr: "10.0.0.1:8000", blocks: []uint64{1, 2}},
		record{kind: kindInFlight, pool: poolKey, addr: "10.0.0.1:8000", inFlight: 7},
		record{kind: kindForget, pool: poolKey, addr: "10.0.0.1:8000", blocks: []uint64{3}}))
	f.Add(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "10.0.0.1:8000", inFlight: 1 << 40}))
	f.Add(encodeFrame(record{kind: kindBlocks, pool: poolKey, addr: "10.0.0.1:8000", blocks: make([]uint64, MaxBlocksPerRecord+1)}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = decodeFrame(b, func(r *record) {
			if !validRecord(r) || r.inFlight < 0 || r.inFlight > MaxInFlightBound {
				t.Fatalf("a record beyond the bounds: %+v", r)
			}
		})
		sender := newSession(testSecret, "a", "b", "c", "d", nil)
		receiver := newSession(testSecret, "a", "b", "c", "d", nil)
		other := newSession(testSecret, "a", "b", "c", "e", nil)
		msg := sender.seal(b)
		if _, err := other.open(msg); err == nil {
			t.Fatal("another stream's session opened the message")
		}
		got, err := receiver.open(msg)
		if err != nil || string(got) != string(b) {
			t.Fatalf("the stream's own session: %q, %v", got, err)
		}
		if _, err := receiver.open(b); err == nil && len(b) >= tagBytes {
			t.Fatal("an untagged message opened")
		}
	})
}
