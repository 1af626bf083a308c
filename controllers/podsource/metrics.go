// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	readyPods   *prometheus.GaugeVec
	servedPools prometheus.Gauge
	watchStarts *prometheus.CounterVec
	liveWatches prometheus.Gauge
	syncSeconds prometheus.Histogram
	// syncFailing is 1 while a pool's pods cannot be listed or watched.
	syncFailing *prometheus.GaugeVec
	// endpointsExpired is 1 while a pool is refused because its watch has
	// failed for longer than Options.StaleEndpointsTimeout.
	endpointsExpired *prometheus.GaugeVec
	// addressesHeldElsewhere counts a pool's pods left out because a
	// newer pod of another namespace holds their IP (addressBook).
	addressesHeldElsewhere *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		readyPods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_pool_ready_pods",
			Help: "Ready pods of a served InferencePool (pods, not pods × target ports).",
		}, []string{"namespace", "name"}),
		servedPools: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poolpicker_served_pools",
			Help: "InferencePools this picker serves.",
		}),
		watchStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolpicker_pool_watch_starts_total",
			Help: "Pod sources started for a served pool (its own watch in the per-pool plan, its subscription to the namespace's watch in the namespace plan): one at start, one more per selector change or plan switch.",
		}, []string{"namespace", "name"}),
		liveWatches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poolpicker_pod_watches",
			Help: "Pod watches running: one per served pool in the per-pool plan, one per namespace in the namespace plan, and the new ones while a selector change or plan switch syncs.",
		}),
		syncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "poolpicker_pool_watch_sync_seconds",
			Help:    "Time from starting a pool's pod watch to its first complete list.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		syncFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolpicker_pool_sync_failing",
			Help: "1 while a served pool's pods cannot be listed or watched (the reason is logged and in an Event on the pool); its requests are answered 503 until it has synced once.",
		}, []string{"namespace", "name"}),
		endpointsExpired: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolpicker_pool_endpoints_expired",
			Help: "1 while a served pool's requests are answered 503 because its pods could not be listed or watched for longer than --stale-endpoints-timeout: its last endpoints are no longer trusted.",
		}, []string{"namespace", "name"}),
		addressesHeldElsewhere: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolpicker_pool_addresses_held_elsewhere",
			Help: "Pods of a served pool left out of its endpoints because a newer pod of another namespace holds their IP on a common target port (a deleted pod's IP given to another tenant's pod while this pool's watch had not yet seen the deletion).",
		}, []string{"namespace", "name"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.readyPods, m.servedPools, m.watchStarts, m.liveWatches, m.syncSeconds, m.syncFailing, m.endpointsExpired, m.addressesHeldElsewhere} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func (m *metrics) forget(namespace, name string) {
	m.readyPods.DeleteLabelValues(namespace, name)
	m.watchStarts.DeleteLabelValues(namespace, name)
	m.syncFailing.DeleteLabelValues(namespace, name)
	m.endpointsExpired.DeleteLabelValues(namespace, name)
	m.addressesHeldElsewhere.DeleteLabelValues(namespace, name)
}
