// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/peersync"
	"github.com/poolpicker/poolpicker/scheduling"
)

// defaultPeerSyncPort is --peer-sync-port's default: next to ext_proc's
// 9002 and health's 9003.
const defaultPeerSyncPort = 9004

// peerSyncOptions are the flags of peer sync (package peersync).
type peerSyncOptions struct {
	enabled bool
	port    int
	peers   []string
	keyFile string
	// The per-peer limits (peersync.Options).
	maxConnectionsPerPeer  int
	maxStreamsPerPeer      int
	maxRecordsPerSecond    int
	maxInFlightPerEndpoint int
	peerTimeout            time.Duration
}

// bindPeerSyncFlags binds the peer-sync flags to o.
func bindPeerSyncFlags(fs *pflag.FlagSet, o *peerSyncOptions) {
	fs.BoolVar(&o.enabled, "peer-sync", o.enabled,
		"Share each replica's picks with the other replicas of this deployment over a gRPC stream (--peer-sync-port), off the pick path: every replica's prefix-cache index and in-flight counts then follow every replica's picks, a few milliseconds late, so N replicas route as one does. The peers are the ready pods of --picker-pod-selector in --picker-namespace, or --peer-sync-peers; a replica takes streams only from their IPs, and applies one only once its sender proved it holds the key of --peer-sync-key-file.")
	fs.IntVar(&o.port, "peer-sync-port", defaultPeerSyncPort,
		"Port of the peer-sync listener (on --bind-address), the same on every replica. TLS 1.3 with the ext_proc certificate unless --secure-serving=false.")
	fs.StringSliceVar(&o.peers, "peer-sync-peers", nil,
		"Comma-separated host:port addresses (IPs or DNS names, resolved every 2s) of the replicas to share picks with, in place of discovering them from the API server (this replica's own address may be listed: it is told apart). Empty: the ready pods of --picker-pod-selector at --peer-sync-port.")
	fs.StringVar(&o.keyFile, "peer-sync-key-file", "",
		"File (a mounted Secret, at least 16 bytes) whose content the replicas authenticate each other with and key the prompt-block hashes they exchange with; the same on every replica. Required with --peer-sync: a replica applies a stream only once its sender proved it holds the key, and sends only to a receiver that proved it.")
	fs.IntVar(&o.maxConnectionsPerPeer, "peer-sync-max-connections-per-peer", peersync.DefaultMaxConnectionsPerPeer,
		"Connections the peer-sync listener keeps open from one address; beyond it a connection is closed at once (poolpicker_peer_sync_peer_limited_total{limit=\"connections\"}).")
	fs.IntVar(&o.maxStreamsPerPeer, "peer-sync-max-streams-per-peer", peersync.DefaultMaxStreamsPerPeer,
		"Peer-sync streams open from one address, over all its connections; beyond it a stream is refused (poolpicker_peer_sync_peer_limited_total{limit=\"streams\"}). A replica opens one.")
	fs.IntVar(&o.maxRecordsPerSecond, "peer-sync-max-records-per-second", peersync.DefaultMaxRecordsPerSecond,
		"Records (picks, forgotten blocks, in-flight counts) applied per second from one address, over all its streams, as deep a burst; beyond it they are dropped (poolpicker_peer_sync_peer_limited_total{limit=\"records\"}).")
	fs.IntVar(&o.maxInFlightPerEndpoint, "peer-sync-max-in-flight", peersync.DefaultMaxInFlightPerEndpoint,
		"Bound on the requests one peer may say it has in flight on an endpoint, and on the peers' sum there: a peer gone wrong makes an endpoint look at most this busy (poolpicker_peer_sync_peer_limited_total{limit=\"in-flight\"}). Raise it for servers that run and queue more requests at once.")
	fs.DurationVar(&o.peerTimeout, "peer-sync-peer-timeout", peersync.DefaultPeerTimeout,
		"How long a peer's stream may carry nothing (a replica sends at least every second) before it is ended and the peer's in-flight counts are taken back; a peer that leaves the peer list is ended at once.")
}

// validatePeerSync checks the peer-sync flags against the other ports.
func validatePeerSync(o *options) error {
	ps := &o.peerSync
	if !ps.enabled {
		return nil
	}
	if ps.port < 1 || ps.port > 65535 {
		return fmt.Errorf("--peer-sync-port %d: must be 1..65535", ps.port)
	}
	for name, p := range map[string]int{"--grpc-port": o.extproc.GRPCPort, "--grpc-health-port": o.extproc.HealthPort, "--metrics-port": o.metricsPort} {
		if p == ps.port {
			return fmt.Errorf("--peer-sync-port %d and %s %d must differ", ps.port, name, p)
		}
	}
	for _, a := range ps.peers {
		if host, port, err := net.SplitHostPort(a); err != nil || port == "" || host == "" {
			return fmt.Errorf("--peer-sync-peers: %q is no host:port", a)
		}
	}
	if ps.keyFile == "" {
		return errors.New("--peer-sync needs --peer-sync-key-file: the replicas authenticate each other with its key (the chart mounts one from a Secret it creates)")
	}
	for name, v := range map[string]int{"--peer-sync-max-connections-per-peer": ps.maxConnectionsPerPeer, "--peer-sync-max-streams-per-peer": ps.maxStreamsPerPeer, "--peer-sync-max-records-per-second": ps.maxRecordsPerSecond} {
		if v < 1 {
			return fmt.Errorf("%s %d: must be at least 1", name, v)
		}
	}
	if ps.maxInFlightPerEndpoint < 1 || ps.maxInFlightPerEndpoint > peersync.MaxInFlightBound {
		return fmt.Errorf("--peer-sync-max-in-flight %d: must be 1..%d", ps.maxInFlightPerEndpoint, peersync.MaxInFlightBound)
	}
	if least := 2 * peersync.DefaultHeartbeatInterval; ps.peerTimeout < least {
		return fmt.Errorf("--peer-sync-peer-timeout %v: must be at least %v (the peers send every %v)", ps.peerTimeout, least, peersync.DefaultHeartbeatInterval)
	}
	return nil
}

// peerSyncKey reads the key file: the secret the replicas authenticate
// each other with, and the hash key derived from it.
func peerSyncKey(o *options) (secret []byte, hashKey uint64, err error) {
	b, err := os.ReadFile(o.peerSync.keyFile)
	if err != nil {
		return nil, 0, fmt.Errorf("--peer-sync-key-file: %w", err)
	}
	material := bytes.TrimSpace(b)
	if len(material) < peersync.MinSecretBytes {
		return nil, 0, fmt.Errorf("--peer-sync-key-file %s holds %d bytes, at least %d are needed (for example: head -c 48 /dev/urandom | base64)", o.peerSync.keyFile, len(material), peersync.MinSecretBytes)
	}
	// The hash key is a digest of the secret, so that the hashes, which
	// the peers exchange, tell nothing of it.
	sum := sha256.Sum256(append([]byte("poolpicker peer sync\x00"), material...))
	for i, c := range sum[:8] {
		hashKey |= uint64(c) << (8 * i)
	}
	return material, hashKey, nil
}

// newPeerSync builds the exchange --peer-sync asks for (nil when off):
// it is the scheduler's Peers and the ext_proc server's in-flight
// observer, and it hands the peers' blocks to *sched, built after it.
// peers lists the replicas found by the controllers (when --peer-sync-peers
// is empty).
func newPeerSync(o *options, reg *datastore.Registry, sched **scheduling.Scheduler, peers func() []string, metrics prometheus.Registerer, log logr.Logger) (*peersync.Exchange, error) {
	if !o.peerSync.enabled {
		return nil, nil
	}
	secret, key, err := peerSyncKey(o)
	if err != nil {
		return nil, err
	}
	if static := o.peerSync.peers; len(static) > 0 {
		peers = func() []string { return static }
	}
	ps := &o.peerSync
	po := peersync.Options{Registry: reg, HashKey: key, Secret: secret, Peers: peers, OnlyPeers: true, Registerer: metrics, Logger: log,
		MaxConnectionsPerPeer: ps.maxConnectionsPerPeer, MaxStreamsPerPeer: ps.maxStreamsPerPeer, MaxRecordsPerSecond: ps.maxRecordsPerSecond,
		MaxInFlightPerEndpoint: ps.maxInFlightPerEndpoint, PeerTimeout: ps.peerTimeout,
		Addr: net.JoinHostPort(o.ha.bindAddress, strconv.Itoa(o.peerSync.port)),
		Learner: peersync.LearnerFuncs{
			Learn: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
				(*sched).LearnPeerBlocks(pool, e, blocks)
			},
			Forget: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
				(*sched).ForgetPeerBlocks(pool, e, blocks)
			},
		}}
	if ip := net.ParseIP(o.ha.bindAddress); ip != nil && !ip.IsUnspecified() {
		po.LocalIP = ip
	}
	if !o.extproc.Insecure {
		serverTLS, err := o.extproc.CertificateTLSConfig()
		if err != nil {
			return nil, err
		}
		// TLS 1.3 on both ends: its sessions export the keying material
		// the peers' proofs are bound to.
		po.ServerTLS = serverTLS.Clone()
		po.ServerTLS.MinVersion = tls.VersionTLS13
		// The replicas' certificates are usually self-signed, so there is
		// no CA to verify them by: the receiver is verified instead by its
		// proof that it holds the key, bound to this TLS session, before
		// anything is sent (package peersync, auth.go).
		po.ClientTLS = &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // the peer proves the shared key over this session, see above
	}
	x, err := peersync.New(po)
	if err != nil {
		return nil, fmt.Errorf("peer sync: %w", err)
	}
	o.scheduling.Peers = x
	reg.AddLoadObserver(x)
	return x, nil
}
