// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package promtest reads metric values from a Prometheus gatherer in tests.
package promtest

import "github.com/prometheus/client_golang/prometheus"

// PoolSum sums the gauge and counter values of the named metric's series
// labelled with the pool's namespace and name (every priority, outcome or
// other label). It is -1 when the gatherer fails, which no poll accepts.
func PoolSum(g prometheus.Gatherer, name, namespace, pool string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return -1
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ns, p string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					ns = l.GetValue()
				case "pool":
					p = l.GetValue()
				}
			}
			if ns == namespace && p == pool {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Value is the gauge or counter value of the named metric's series whose
// labels are exactly labels (none: the unlabelled series); 0 when there is
// no such series, -1 when the gatherer fails, which no poll accepts.
func Value(g prometheus.Gatherer, name string, labels map[string]string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return 0
}
