// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Names of the exchange's metrics.
const (
	MetricPeers    = "poolpicker_peer_sync_peers"
	MetricStreams  = "poolpicker_peer_sync_inbound_streams"
	MetricSent     = "poolpicker_peer_sync_sent_records_total"
	MetricReceived = "poolpicker_peer_sync_received_records_total"
	MetricDropped  = "poolpicker_peer_sync_dropped_records_total"
	MetricRefused  = "poolpicker_peer_sync_refused_streams_total"
	// MetricKeyMismatch counts streams refused because their sender keys
	// the block hashes differently: nonzero means the replicas do not
	// share --peer-sync-key-file.
	MetricKeyMismatch = "poolpicker_peer_sync_key_mismatch_streams_total"
	// MetricLimited counts, per peer address, what its limits turned away.
	MetricLimited = "poolpicker_peer_sync_peer_limited_total"
	// MetricEnded counts the streams this replica ended: silent ones, and
	// those of an address that left the peer list.
	MetricEnded = "poolpicker_peer_sync_ended_streams_total"
	// MetricPanics counts the streams ended by a panic while applying them.
	MetricPanics = "poolpicker_peer_sync_panics_total"
	// MetricUnverified counts the streams this replica did not send on
	// because their receiver did not prove it holds the key.
	MetricUnverified = "poolpicker_peer_sync_unverified_peers_total"
)

type metrics struct {
	peers, streams prometheus.Gauge
	sent           prometheus.Counter
	keyMismatch    prometheus.Counter
	panics         prometheus.Counter
	unverified     prometheus.Counter
	refused        *prometheus.CounterVec
	limited        *prometheus.CounterVec
	ended          *prometheus.CounterVec
	received       *prometheus.CounterVec
	dropped        *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		peers:   prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricPeers, Help: "Peer replicas this replica sends its picks to."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricStreams, Help: "Peer replicas' streams this replica receives picks on."}),
		sent:    prometheus.NewCounter(prometheus.CounterOpts{Name: MetricSent, Help: "Records of this replica's picks and in-flight counts encoded for the peers."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRefused, Help: "Streams refused, by reason: not-a-peer (from no peer replica's address), unauthenticated (no proof of the key, a wrong one, or a frame whose tag does not match), limit (more streams from the address than --peer-sync-max-streams-per-peer)."},
			[]string{"reason"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricLimited, Help: "What a peer's limits turned away, by peer (its IP; other: an address that is no peer's) and limit: connections and streams refused, records dropped beyond the rate, in-flight counts cut to the bound."},
			[]string{"peer", "limit"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEnded, Help: "Peers' streams this replica ended, by reason: silent (nothing for --peer-sync-peer-timeout), left-peer-list (the address is no peer's any more); the sender's in-flight counts are taken back."},
			[]string{"reason"}),
		panics:      prometheus.NewCounter(prometheus.CounterOpts{Name: MetricPanics, Help: "Peers' streams ended by a panic while this replica applied them (the others go on)."}),
		unverified:  prometheus.NewCounter(prometheus.CounterOpts{Name: MetricUnverified, Help: "Streams this replica opened and did not send on because the receiver did not prove it holds the peer-sync key."}),
		keyMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricKeyMismatch, Help: "Streams refused because the peer keys its block hashes differently (the replicas do not share --peer-sync-key-file)."}),
		received:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricReceived, Help: "Records applied from the peers' streams, by kind (blocks, forget, in-flight)."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDropped, Help: "Records not sent or not applied, by reason: queue (this replica's send queue was full), peer-queue (a peer's stream fell behind), rate (a peer sent beyond the rate limit), unknown (a pool or endpoint this replica does not have), malformed (a frame refused whole)."},
			[]string{"reason"}),
	}
	if r == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.peers, m.streams, m.sent, m.refused, m.keyMismatch, m.received, m.dropped, m.limited, m.ended, m.panics, m.unverified} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
