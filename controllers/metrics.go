package controllers

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
			Help: "Pod watches started for a served pool: one at start, one more per selector change.",
		}, []string{"namespace", "name"}),
		liveWatches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poolpicker_pod_watches",
			Help: "Pod watches running: one per served pool, two while a selector change syncs.",
		}),
		syncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "poolpicker_pool_watch_sync_seconds",
			Help:    "Time from starting a pool's pod watch to its first complete list.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.readyPods, m.servedPools, m.watchStarts, m.liveWatches, m.syncSeconds} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func (m *metrics) forget(namespace, name string) {
	m.readyPods.DeleteLabelValues(namespace, name)
	m.watchStarts.DeleteLabelValues(namespace, name)
}
