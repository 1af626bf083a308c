// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the KV-event metrics: poolpicker's, labelled by pool, and the
// ones llm-d's EPP exports for its subscribers, under their names and
// labels so that its dashboards read poolpicker's too.
const (
	MetricGaps           = "poolpicker_kv_events_gaps_total"
	MetricResyncs        = "poolpicker_kv_events_resyncs_total"
	MetricReplays        = "poolpicker_kv_events_replays_total"
	MetricDropped        = "poolpicker_kv_events_dropped_total"
	MetricBlocks         = "poolpicker_kv_events_blocks"
	MetricUnconfirmed    = "poolpicker_kv_events_unconfirmed_endpoints"
	MetricLLMDActive     = "llm_d_router_epp_kv_cache_events_active_subscribers"
	MetricLLMDReconnects = "llm_d_router_epp_kv_cache_events_subscriber_reconnections_total"
	MetricLLMDMessages   = "llm_d_router_epp_kv_cache_events_messages_received_total"
	MetricLLMDErrors     = "llm_d_router_epp_kv_cache_events_zmq_errors_total"
)

// metrics are one manager's series; managers sharing a registerer share
// the collectors.
type metrics struct {
	gaps, resyncs, replays, dropped, messages, reconnects, errors *prometheus.CounterVec
	blocks, unconfirmed                                           *prometheus.GaugeVec
	active                                                        prometheus.Gauge
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &metrics{}
	counters := []struct {
		c      **prometheus.CounterVec
		name   string
		help   string
		labels []string
	}{
		{&m.gaps, MetricGaps, "Gaps in a server's KV-event sequence numbers.", []string{"namespace", "pool"}},
		{&m.resyncs, MetricResyncs, "Times an endpoint's event index was cleared because a gap could not be replayed; it is scored from the learned index until rebuilt.", []string{"namespace", "pool"}},
		{&m.replays, MetricReplays, "Replays requested from a server's replay socket, by result (ok, failed).", []string{"namespace", "pool", "result"}},
		{&m.dropped, MetricDropped, "KV events or blocks refused, by reason (endpoint_blocks, process_budget, unknown_parent, rate, message_bytes, decode).", []string{"namespace", "pool", "reason"}},
		{&m.messages, MetricLLMDMessages, "Total number of messages received from ZMQ subscribers (llm-d's name).", []string{"pod_identifier"}},
		{&m.reconnects, MetricLLMDReconnects, "Total number of ZMQ subscriber reconnection attempts (llm-d's name).", []string{"pod_identifier"}},
		{&m.errors, MetricLLMDErrors, "Total number of ZMQ subscriber errors (llm-d's name).", []string{"pod_identifier", "operation"}},
	}
	for _, c := range counters {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: c.name, Help: c.help}, c.labels)
		got, err := register(r, v)
		if err != nil {
			return nil, err
		}
		*c.c = got.(*prometheus.CounterVec)
	}
	gauges := []struct {
		g    **prometheus.GaugeVec
		name string
		help string
	}{
		{&m.blocks, MetricBlocks, "Blocks the pool's servers hold according to their KV events."},
		{&m.unconfirmed, MetricUnconfirmed, "Endpoints of the pool subscribed to whose event index is not (yet) their server's whole history."},
	}
	for _, g := range gauges {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: g.name, Help: g.help}, []string{"namespace", "pool"})
		got, err := register(r, v)
		if err != nil {
			return nil, err
		}
		*g.g = got.(*prometheus.GaugeVec)
	}
	a, err := register(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricLLMDActive, Help: "Number of ZMQ subscribers currently managed, including those retrying a failed connection (llm-d's name)."}))
	if err != nil {
		return nil, err
	}
	m.active = a.(prometheus.Gauge)
	return m, nil
}

func register(r prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	if err := r.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if errors.As(err, &dup) {
			return dup.ExistingCollector, nil
		}
		return nil, fmt.Errorf("kv events: registering metrics: %w", err)
	}
	return c, nil
}
