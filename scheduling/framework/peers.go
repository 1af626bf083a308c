// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

// Peers carries what plugins learn from this replica's picks to the
// picker's peer replicas (peer sync), so that each replica's beliefs about
// the servers follow every replica's picks, as one replica's do. It is
// asynchronous: nothing on it waits for a peer.
type Peers interface {
	// HashKey keys the block hashes plugins share: the same on every
	// replica, so a block hashed here names the same block there.
	HashKey() uint64
	// ShareBlocks tells the peers that endpoint of pool now caches the
	// prompt blocks (chained hashes under HashKey, the prefix first). It
	// copies blocks and never blocks; under backpressure it drops.
	ShareBlocks(pool Pool, endpoint Endpoint, blocks []uint64)
	// ForgetBlocks tells the peers that endpoint of pool no longer caches
	// the blocks (its server reported fewer cached prompt tokens than
	// predicted, so blocks used before went too). Like ShareBlocks, it
	// copies blocks and never blocks.
	ForgetBlocks(pool Pool, endpoint Endpoint, blocks []uint64)
}

// PeerLearner is a plugin that learns from the picks of the picker's peer
// replicas: a peer's pick sent endpoint the prompt whose blocks are given
// (chained hashes under Peers.HashKey, at most a bound the receiver sets).
// It runs on the peer stream's goroutine, never on the pick path.
type PeerLearner interface {
	Plugin
	LearnPeerBlocks(pool Pool, endpoint Endpoint, blocks []uint64)
}

// PeerForgetter is a plugin that learns from the picker's peer replicas
// what a server no longer caches: a peer's server reported a miss, and
// endpoint no longer holds the blocks given (chained hashes under
// Peers.HashKey, at most a bound the receiver sets). It runs on the peer
// stream's goroutine, never on the pick path.
type PeerForgetter interface {
	Plugin
	ForgetPeerBlocks(pool Pool, endpoint Endpoint, blocks []uint64)
}

// PeerHandle is implemented by the Handle of a scheduler built with peers:
// Peers is nil when peer sync is off.
type PeerHandle interface {
	Handle
	Peers() Peers
}

// NewPeerHandle returns h with peers (nil: none).
func NewPeerHandle(h Handle, peers Peers) PeerHandle {
	return &peerHandle{Handle: h, peers: peers}
}

type peerHandle struct {
	Handle
	peers Peers
}

func (h *peerHandle) Peers() Peers { return h.peers }

// PeersOf is h's Peers, nil when h has none.
func PeersOf(h Handle) Peers {
	if ph, ok := h.(PeerHandle); ok {
		return ph.Peers()
	}
	return nil
}
