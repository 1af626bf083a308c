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
)

type metrics struct {
	peers, streams prometheus.Gauge
	sent, refused  prometheus.Counter
	keyMismatch    prometheus.Counter
	received       *prometheus.CounterVec
	dropped        *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		peers:       prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricPeers, Help: "Peer replicas this replica sends its picks to."}),
		streams:     prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricStreams, Help: "Peer replicas' streams this replica receives picks on."}),
		sent:        prometheus.NewCounter(prometheus.CounterOpts{Name: MetricSent, Help: "Records of this replica's picks and in-flight counts encoded for the peers."}),
		refused:     prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRefused, Help: "Streams refused because they came from no peer replica's address."}),
		keyMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricKeyMismatch, Help: "Streams refused because the peer keys its block hashes differently (the replicas do not share --peer-sync-key-file)."}),
		received:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricReceived, Help: "Records applied from the peers' streams, by kind (blocks, forget, in-flight)."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDropped, Help: "Records not sent or not applied, by reason: queue (this replica's send queue was full), peer-queue (a peer's stream fell behind), rate (a peer sent beyond the rate limit), unknown (a pool or endpoint this replica does not have), malformed (a frame refused whole)."},
			[]string{"reason"}),
	}
	if r == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.peers, m.streams, m.sent, m.refused, m.keyMismatch, m.received, m.dropped} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
