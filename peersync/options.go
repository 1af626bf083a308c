// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// Learner is what learns from the peers: the scheduler, whose prefix
// plugins record a peer's blocks as their own pick would, and forget the
// blocks a peer's server report said an endpoint no longer has.
type Learner interface {
	LearnPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
	ForgetPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
}

// Defaults of Options.
const (
	DefaultFlushInterval       = 2 * time.Millisecond
	DefaultSnapshotInterval    = time.Second
	DefaultRefreshInterval     = 2 * time.Second
	DefaultQueueRecords        = 1 << 14
	DefaultMaxRecordsPerSecond = 1 << 15
	DefaultMaxFrameBytes       = 1 << 20
	// DefaultMaxConnectionsPerPeer and DefaultMaxStreamsPerPeer leave
	// room for a replica's one stream and its reconnection (the old one
	// not yet seen gone), and for a few replicas behind one address.
	DefaultMaxConnectionsPerPeer = 4
	DefaultMaxStreamsPerPeer     = 4
	// DefaultMaxInFlightPerEndpoint is more than a model server runs and
	// queues at once (vLLM runs at most 256 or 1024 sequences by default).
	DefaultMaxInFlightPerEndpoint = 1024
	// DefaultHeartbeatInterval is how often a sender with nothing to send
	// sends an empty frame; DefaultPeerTimeout how long a receiver waits
	// for a frame before it ends the stream and takes its counts back.
	DefaultHeartbeatInterval = time.Second
	DefaultPeerTimeout       = 5 * time.Second
)

// Options configure an Exchange; zero fields take the defaults above.
type Options struct {
	// Registry is where a peer's records find their pool and endpoint; a
	// record naming neither here is dropped.
	Registry *datastore.Registry
	// Learner hears of the peers' blocks, learned and forgotten.
	Learner Learner
	// HashKey keys the block hashes (framework.Peers.HashKey): every
	// replica of a deployment must have the same.
	HashKey uint64
	// Listener serves the peers' streams. Nil: Start listens on Addr, or,
	// without it, this replica only sends.
	Listener net.Listener
	// Addr is the host:port Start listens on when Listener is nil.
	Addr string
	// Peers returns the addresses (host:port) of the peer replicas to send
	// to, without this one's own; asked every RefreshInterval.
	Peers func() []string
	// Secret authenticates the replicas to each other (the content of a
	// mounted Secret, the same in every replica; at least MinSecretBytes):
	// a stream is applied only once its sender proved it holds it, and
	// sent to only once its receiver did (see auth.go).
	Secret []byte
	// OnlyPeers accepts streams only from the hosts of Peers' addresses
	// (their IPs, as the connection's source; a name is resolved): another
	// pod that can reach the port is refused before it sends anything,
	// and a host that leaves the list has its streams ended.
	OnlyPeers bool
	// Resolver resolves the names among Peers' hosts. Nil: the system's.
	Resolver *net.Resolver
	// LocalIP, when set, is the source address the streams to peers dial
	// from (the replica's bind address), so that a peer with OnlyPeers
	// knows it.
	LocalIP net.IP
	// ServerTLS, when set, is the listener's TLS (ask for and verify
	// client certificates there: a peer is anyone who can connect).
	// ClientTLS is the TLS the streams to peers dial with. Nil: plaintext
	// (loopback tests and benchmarks).
	ServerTLS, ClientTLS *tls.Config
	// FlushInterval is how long records gather before they are sent: the
	// delay a peer learns a pick with, at most, beyond the network's.
	FlushInterval time.Duration
	// SnapshotInterval is how often every nonzero in-flight count is sent
	// again, so a peer that missed an update or connected late is right
	// within it.
	SnapshotInterval time.Duration
	// RefreshInterval is how often Peers is asked.
	RefreshInterval time.Duration
	// QueueRecords bounds the records waiting to be sent; beyond it a
	// pick's blocks are dropped (and counted).
	QueueRecords int
	// MaxRecordsPerSecond bounds what one peer (all the streams from its
	// address) may deliver; beyond it records are dropped (and counted), so
	// a peer gone wild costs bounded work.
	MaxRecordsPerSecond int
	// MaxConnectionsPerPeer bounds the connections open from one address;
	// beyond it a connection is closed at once (and counted).
	MaxConnectionsPerPeer int
	// MaxStreamsPerPeer bounds the streams open from one address, over
	// all its connections; beyond it a stream is refused (and counted).
	MaxStreamsPerPeer int
	// MaxInFlightPerEndpoint bounds what one peer may say it has in flight
	// on an endpoint, and what all the peers together count there, so that
	// a peer gone wrong can make an endpoint look at most as busy as a
	// server can plausibly be.
	MaxInFlightPerEndpoint int
	// HeartbeatInterval is how often a stream with nothing to carry sends
	// an empty frame, so that its receiver knows it is alive.
	HeartbeatInterval time.Duration
	// PeerTimeout is how long a stream may be silent: beyond it the
	// receiver ends it, and takes the sender's in-flight counts back
	// unless the sender has another stream open. Longer than the peers'
	// HeartbeatInterval.
	PeerTimeout time.Duration
	// MaxFrameBytes bounds a frame, both ways.
	MaxFrameBytes int
	Logger        logr.Logger
	// Registerer is where the exchange's metrics go. Nil: nowhere.
	Registerer prometheus.Registerer
}

func (o *Options) setDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.FlushInterval, DefaultFlushInterval)
	def(&o.SnapshotInterval, DefaultSnapshotInterval)
	def(&o.RefreshInterval, DefaultRefreshInterval)
	def(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&o.PeerTimeout, DefaultPeerTimeout)
	for _, v := range []struct {
		p *int
		d int
	}{{&o.QueueRecords, DefaultQueueRecords}, {&o.MaxRecordsPerSecond, DefaultMaxRecordsPerSecond}, {&o.MaxFrameBytes, DefaultMaxFrameBytes},
		{&o.MaxConnectionsPerPeer, DefaultMaxConnectionsPerPeer}, {&o.MaxStreamsPerPeer, DefaultMaxStreamsPerPeer}, {&o.MaxInFlightPerEndpoint, DefaultMaxInFlightPerEndpoint}} {
		if *v.p <= 0 {
			*v.p = v.d
		}
	}
	o.MaxInFlightPerEndpoint = min(o.MaxInFlightPerEndpoint, MaxInFlightBound)
	if o.Peers == nil {
		o.Peers = func() []string { return nil }
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
}

// LearnerFuncs are functions as a Learner (a scheduler built after the
// exchange, whose Peers it is); a nil one ignores its records.
type LearnerFuncs struct {
	Learn, Forget func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
}

// LearnPeerBlocks implements Learner.
func (f LearnerFuncs) LearnPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if f.Learn != nil {
		f.Learn(pool, e, blocks)
	}
}

// ForgetPeerBlocks implements Learner.
func (f LearnerFuncs) ForgetPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if f.Forget != nil {
		f.Forget(pool, e, blocks)
	}
}
