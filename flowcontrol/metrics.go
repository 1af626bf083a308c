// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// Outcomes of a wait, the outcome label of the queue duration.
const (
	outcomeDispatched = "dispatched"
	outcomeRejected   = "rejected"
	outcomeCanceled   = "canceled"
)

// metrics are the controller's series, labelled by pool (namespace and
// pool, its name, as the request metrics) and band (the objective priority). Both are bounded by what the operator
// configures: served pools and the priorities of their objectives. A
// removed pool's series are deleted.
type metrics struct {
	queueSize   *prometheus.GaugeVec
	queueBytes  *prometheus.GaugeVec
	duration    *prometheus.HistogramVec
	dispatched  *prometheus.CounterVec
	rejected    *prometheus.CounterVec
	waitingRoom *prometheus.GaugeVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &metrics{
		queueSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_extension_flow_control_queue_size",
			Help: "Requests waiting in the picker's queue of a pool, per priority band.",
		}, []string{"namespace", "pool", "priority"}),
		queueBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_extension_flow_control_queue_bytes",
			Help: "Request body bytes waiting in the picker's queue of a pool, per priority band.",
		}, []string{"namespace", "pool", "priority"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_extension_flow_control_request_queue_duration_seconds",
			Help:    "Time requests spent in a pool's queue, per priority band and outcome (dispatched, rejected, canceled).",
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"namespace", "pool", "priority", "outcome"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_flow_control_dispatched_total",
			Help: "Requests released from a pool's queue to the scheduler, per priority band.",
		}, []string{"namespace", "pool", "priority"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_flow_control_rejected_total",
			Help: "Requests refused by flow control, per pool, priority band and reason (QueueTTLExpired, QueueFull, QueueBytesExceeded, NoEndpointsTimeout, PoolRemoved).",
		}, []string{"namespace", "pool", "priority", "reason"}),
		waitingRoom: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_extension_flow_control_waiting_room_requests",
			Help: "Requests waiting for a pool without ready endpoints to get one (scale from zero).",
		}, []string{"namespace", "pool"}),
	}
	for _, c := range []prometheus.Collector{m.queueSize, m.queueBytes, m.duration, m.dispatched, m.rejected, m.waitingRoom} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// bandSeries are one band's series, resolved once when the band is made.
type bandSeries struct {
	size, bytes prometheus.Gauge
	dispatched  prometheus.Counter
	durations   [3]prometheus.Observer // by outcome index
}

func (m *metrics) band(pool datastore.PoolKey, priority int) bandSeries {
	p := strconv.Itoa(priority)
	return bandSeries{
		size:       m.queueSize.WithLabelValues(pool.Namespace, pool.Name, p),
		bytes:      m.queueBytes.WithLabelValues(pool.Namespace, pool.Name, p),
		dispatched: m.dispatched.WithLabelValues(pool.Namespace, pool.Name, p),
		durations: [3]prometheus.Observer{
			m.duration.WithLabelValues(pool.Namespace, pool.Name, p, outcomeDispatched),
			m.duration.WithLabelValues(pool.Namespace, pool.Name, p, outcomeRejected),
			m.duration.WithLabelValues(pool.Namespace, pool.Name, p, outcomeCanceled),
		},
	}
}

func (m *metrics) reject(pool datastore.PoolKey, priority int, reason string) {
	m.rejected.WithLabelValues(pool.Namespace, pool.Name, strconv.Itoa(priority), reason).Inc()
}

func (m *metrics) forget(pool datastore.PoolKey) {
	l := prometheus.Labels{"namespace": pool.Namespace, "pool": pool.Name}
	m.queueSize.DeletePartialMatch(l)
	m.queueBytes.DeletePartialMatch(l)
	m.duration.DeletePartialMatch(l)
	m.dispatched.DeletePartialMatch(l)
	m.rejected.DeletePartialMatch(l)
	m.waitingRoom.DeletePartialMatch(l)
}
