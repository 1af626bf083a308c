// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/controllers"
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
}

// bindPeerSyncFlags binds the peer-sync flags to o.
func bindPeerSyncFlags(fs *pflag.FlagSet, o *peerSyncOptions) {
	fs.BoolVar(&o.enabled, "peer-sync", o.enabled,
		"Share each replica's picks with the other replicas of this deployment over a gRPC stream (--peer-sync-port), off the pick path: every replica's prefix-cache index and in-flight counts then follow every replica's picks, a few milliseconds late, so N replicas route as one does. The peers are the ready pods of --picker-pod-selector in --picker-namespace, or --peer-sync-peers; a replica takes streams only from their IPs.")
	fs.IntVar(&o.port, "peer-sync-port", defaultPeerSyncPort,
		"Port of the peer-sync listener (on --bind-address), the same on every replica. TLS with the ext_proc certificate unless --secure-serving=false.")
	fs.StringSliceVar(&o.peers, "peer-sync-peers", nil,
		"Comma-separated host:port addresses of the replicas to share picks with, in place of discovering them from the API server (this replica's own address may be listed: it is told apart). Empty: the ready pods of --picker-pod-selector at --peer-sync-port.")
	fs.StringVar(&o.keyFile, "peer-sync-key-file", "",
		"File (a mounted Secret) whose content keys the prompt-block hashes the replicas exchange; the same on every replica. Empty: a key derived from --picker-namespace and --picker-name, which a client that knows them could use to craft prompts whose blocks collide with others' (and make them miss the cache).")
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
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return fmt.Errorf("--peer-sync-peers: %q is no host:port", a)
		}
	}
	return nil
}

// peerSyncKey is the hash key: the key file's digest, or one derived
// from the deployment's name.
func peerSyncKey(o *options) (uint64, error) {
	var material []byte
	if o.peerSync.keyFile != "" {
		b, err := os.ReadFile(o.peerSync.keyFile)
		if err != nil {
			return 0, fmt.Errorf("--peer-sync-key-file: %w", err)
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			return 0, fmt.Errorf("--peer-sync-key-file %s is empty", o.peerSync.keyFile)
		}
		material = b
	} else {
		material = []byte(cmp.Or(o.controllers.PickerNamespace, controllers.DefaultPickerNamespace) + "/" + cmp.Or(o.controllers.PickerName, controllers.DefaultPickerName))
	}
	sum := sha256.Sum256(append([]byte("poolpicker peer sync\x00"), material...))
	var key uint64
	for i, b := range sum[:8] {
		key |= uint64(b) << (8 * i)
	}
	return key, nil
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
	key, err := peerSyncKey(o)
	if err != nil {
		return nil, err
	}
	if static := o.peerSync.peers; len(static) > 0 {
		peers = func() []string { return static }
	}
	po := peersync.Options{Registry: reg, HashKey: key, Peers: peers, OnlyPeers: true, Registerer: metrics, Logger: log,
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
		if po.ServerTLS, err = o.extproc.CertificateTLSConfig(); err != nil {
			return nil, err
		}
		// A peer is known by its address, from the API server (OnlyPeers);
		// TLS keeps the stream private. The replicas' certificates are
		// usually self-signed, so there is no CA to verify them by.
		po.ClientTLS = &tls.Config{MinVersion: po.ServerTLS.MinVersion, InsecureSkipVerify: true} //nolint:gosec // peers are authenticated by source address, see above
	}
	x, err := peersync.New(po)
	if err != nil {
		return nil, fmt.Errorf("peer sync: %w", err)
	}
	o.scheduling.Peers, o.extproc.InFlight = x, x
	return x, nil
}
