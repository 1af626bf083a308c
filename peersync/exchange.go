// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package peersync streams what each picker replica learns from its picks
// (the prompt blocks an endpoint now caches, those its server's reports
// said it no longer caches, and the requests it has in flight there) to
// its peer replicas over long-lived gRPC streams, off the pick path, so
// that every replica's prefix index and load view follow every replica's
// picks, as one replica's follow its own.
package peersync

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Exchange is one replica's end of the peer streams: it implements
// framework.Peers for the scheduler, hears of its in-flight changes
// (InFlightChanged), sends both to every peer, and applies what the peers
// send.
type Exchange struct {
	opts Options
	// id tells this exchange's streams apart from a peer's: a replica
	// whose peer list names itself refuses its own stream.
	id string
	// keyPrint names HashKey without giving it away, so that two replicas
	// keyed differently, whose blocks would never match, find out.
	keyPrint string
	metrics  *metrics
	kick     chan struct{}

	mu       sync.Mutex
	pending  []record
	dirty    map[*datastore.Endpoint]datastore.PoolKey
	reported map[*datastore.Endpoint]datastore.PoolKey // sent nonzero since the last snapshot
	peers    map[string]*peer
	// resolved is the last answer for each name among the peers' hosts,
	// kept when a lookup fails (read and written by Start's goroutine).
	resolved map[string][]string

	// in is what the peers' streams have brought (inbound.go).
	in inbound
	// wg counts the goroutines Start waits for.
	wg sync.WaitGroup

	// legacy makes serve answer as the release before forget records did
	// (no forgetHeader): what a replica of that release does in a rolling
	// update, for the tests.
	legacy bool
}

var _ framework.Peers = (*Exchange)(nil)

// New returns an Exchange; Start runs it.
func New(opts Options) (*Exchange, error) {
	opts.setDefaults()
	if opts.Registry == nil || opts.Learner == nil {
		return nil, errors.New("peersync: a Registry and a Learner are needed")
	}
	if len(opts.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("peersync: a Secret of at least %d bytes is needed to authenticate the peers, got %d", MinSecretBytes, len(opts.Secret))
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	return &Exchange{opts: opts, id: hex.EncodeToString(id[:]), keyPrint: keyFingerprint(opts.HashKey), metrics: m, kick: make(chan struct{}, 1),
		dirty: map[*datastore.Endpoint]datastore.PoolKey{}, reported: map[*datastore.Endpoint]datastore.PoolKey{}, peers: map[string]*peer{},
		resolved: map[string][]string{}, in: newInbound()}, nil
}

// HashKey implements framework.Peers.
func (x *Exchange) HashKey() uint64 { return x.opts.HashKey }

// keyFingerprint is the first 8 bytes of a SHA-256 of the key, in hex: the
// same on replicas of the same key, and no help to whoever reads it in
// finding the key (that takes a search of all 2^64 keys).
func keyFingerprint(key uint64) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], key)
	sum := sha256.Sum256(append([]byte("poolpicker peer sync key\x00"), b[:]...))
	return hex.EncodeToString(sum[:8])
}

// ShareBlocks implements framework.Peers.
func (x *Exchange) ShareBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	x.queueBlocks(kindBlocks, pool, e, blocks)
}

// ForgetBlocks implements framework.Peers: at most MaxBlocksPerRecord
// blocks, the first ones given, go.
func (x *Exchange) ForgetBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	x.queueBlocks(kindForget, pool, e, blocks)
}

var _ datastore.LoadObserver = (*Exchange)(nil)

// InFlightChanged tells the exchange that this replica's count of
// requests in flight on e (of pool) changed: the count as it is when the
// records are sent goes to the peers, so changes in between coalesce.
func (x *Exchange) InFlightChanged(pool *datastore.Pool, e *datastore.Endpoint) {
	if pool == nil || e == nil {
		return
	}
	x.mu.Lock()
	x.dirty[e] = pool.Key
	x.mu.Unlock()
	x.wake()
}

// Start serves the peers' streams and sends to the peers until ctx ends;
// every goroutine it started has ended when it returns.
func (x *Exchange) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if x.opts.Listener == nil && x.opts.Addr != "" {
		lis, err := net.Listen("tcp", x.opts.Addr)
		if err != nil {
			return fmt.Errorf("peer sync: %w", err)
		}
		x.opts.Listener = lis
	}
	wg := &x.wg
	// The peers are known before the first stream is accepted (OnlyPeers).
	x.syncPeers(ctx, wg)
	var srv *grpc.Server
	if x.opts.Listener != nil {
		creds := insecure.NewCredentials()
		if x.opts.ServerTLS != nil {
			creds = credentials.NewTLS(x.opts.ServerTLS)
		}
		// Stop waits for the handlers, so that none starts a goroutine
		// once wg is waited on.
		// Keepalive closes the connection of a peer that vanished (its
		// place then counts no more against its address), and lets the
		// peers' pings through (see send).
		srv = grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(x.opts.MaxFrameBytes+tagBytes+64),
			grpc.MaxConcurrentStreams(uint32(x.opts.MaxStreamsPerPeer)), grpc.WaitForHandlers(true),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: x.opts.PeerTimeout, Timeout: x.opts.PeerTimeout}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: DefaultHeartbeatInterval, PermitWithoutStream: true}))
		wirepb.RegisterPeerSyncServer(srv, pushService{x: x})
		lis := &limitedListener{Listener: x.opts.Listener, x: x}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				x.opts.Logger.Error(err, "peer sync listener stopped")
			}
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); x.flushLoop(ctx) }()

	refresh := time.NewTicker(x.opts.RefreshInterval)
	defer refresh.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-refresh.C:
			x.syncPeers(ctx, wg)
		}
	}
	if srv != nil {
		srv.Stop()
	}
	x.mu.Lock()
	for addr, p := range x.peers {
		p.cancel()
		delete(x.peers, addr)
	}
	x.mu.Unlock()
	wg.Wait()
	return nil
}
