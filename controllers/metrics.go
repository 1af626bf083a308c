// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the writers' (the pod sources' are package podsource's).
type metrics struct {
	leader    prometheus.Gauge
	conflicts *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poolpicker_leader",
			Help: "1 on the replica that holds the lease and writes pool claims, picker Services and EndpointSlices.",
		}),
		conflicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolpicker_pool_conflicts",
			Help: "1 while an object this deployment did not create stands in its way for a pool (kind: claim, another deployment serves it; Service or EndpointSlice, the picker Service's name is taken). Set on the leader.",
		}, []string{"namespace", "name", "kind"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.leader, m.conflicts} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
