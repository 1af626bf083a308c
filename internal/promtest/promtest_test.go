// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestValueAndPoolSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	plain := prometheus.NewGauge(prometheus.GaugeOpts{Name: "plain"})
	byPool := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "by_pool_total"}, []string{"namespace", "pool", "outcome"})
	reg.MustRegister(plain, byPool)
	plain.Set(7)
	byPool.WithLabelValues("ns", "a", "ok").Add(3)
	byPool.WithLabelValues("ns", "a", "shed").Add(2)
	byPool.WithLabelValues("ns", "b", "ok").Add(5)

	cases := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"unlabelled", "plain", nil, 7},
		{"exact labels", "by_pool_total", map[string]string{"namespace": "ns", "pool": "a", "outcome": "shed"}, 2},
		{"a label short is no match", "by_pool_total", map[string]string{"namespace": "ns", "pool": "a"}, 0},
		{"labels given to an unlabelled metric", "plain", map[string]string{"namespace": "ns"}, 0},
		{"no such metric", "absent", nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Value(reg, c.metric, c.labels); got != c.want {
				t.Fatalf("Value = %v, want %v", got, c.want)
			}
		})
	}
	if got := PoolSum(reg, "by_pool_total", "ns", "a"); got != 5 {
		t.Fatalf("PoolSum = %v, want 5 (both outcomes of pool a)", got)
	}
}
