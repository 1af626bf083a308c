// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// labelCap bounds the model names used as label values, per namespace
// (the tenant): model names come from clients, so they must not grow
// series without bound, and one tenant's names must not turn another's
// into "other". A name the request's pool's rewrites mention is always
// admitted (the operator declared it); of the others the first max
// distinct of each namespace are admitted and the rest counted as "other",
// as is any value that fails labelvalue.Check (request paths refuse those
// first; rewrite targets from the API server are not length-checked
// there). Pool and pod labels are bounded by the served pools, and deleted
// with them (PoolRemoved, EndpointsChanged); a namespace's names go when
// its last pool does.
type labelCap struct {
	mu   sync.RWMutex
	max  int
	seen map[string]map[string]struct{} // namespace, then name
	desc *prometheus.Desc
}

func newLabelCap(max int) *labelCap {
	return &labelCap{max: max, seen: map[string]map[string]struct{}{},
		desc: prometheus.NewDesc("poolpicker_model_labels", "Distinct model names a namespace's requests use as metric label values now, of the --max-model-labels each namespace may use (names its pools' InferenceModelRewrites mention are not counted).", []string{"namespace"}, nil)}
}

func (c *labelCap) value(ns, v string, pol *datastore.Policy) string {
	if v == "" {
		return v
	}
	c.mu.RLock()
	_, ok := c.seen[ns][v]
	n := len(c.seen[ns])
	c.mu.RUnlock()
	if ok {
		return v
	}
	if !labelvalue.Valid(v, 0) {
		return otherLabel
	}
	if pol.Mentions(v) {
		return v
	}
	if n >= c.max {
		return otherLabel
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.seen[ns]
	if names == nil {
		names = map[string]struct{}{}
		c.seen[ns] = names
	}
	if _, ok := names[v]; ok {
		return v
	}
	if len(names) >= c.max {
		return otherLabel
	}
	names[v] = struct{}{}
	return v
}

// forget drops a namespace's names: its last pool is gone, and their
// series with it.
func (c *labelCap) forget(ns string) {
	c.mu.Lock()
	delete(c.seen, ns)
	c.mu.Unlock()
}

// Describe and Collect make the cap a prometheus.Collector of each
// namespace's count.
func (c *labelCap) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *labelCap) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for ns, names := range c.seen {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(len(names)), ns)
	}
}
