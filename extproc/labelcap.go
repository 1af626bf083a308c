// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// limitModelLabels names the model-name label budget in the fair-share
// metrics (label limit of poolpicker_fair_share_*).
const limitModelLabels = "model_labels"

// labelCap bounds the model names used as label values: model names come
// from clients, so they must not grow series without bound, and one
// tenant's names must not turn another's into "other". The budget is
// process-wide, a fairshare.Limit shared between namespaces (the tenants;
// a name is its namespace's, whichever of its pools used it, so each
// namespace is one account, of pool ""): a namespace may borrow names
// other namespaces leave idle. A label value is never released by its
// holder, so borrowed names are given back on demand: a namespace within
// its guaranteed share that finds the budget spent takes back the most
// recently admitted name of the namespace that borrows most, whose series
// are deleted (revoke) and whose later requests count as "other".
//
// A name the request's pool's rewrites mention is always admitted and not
// counted (the operator declared it); a value that fails labelvalue.Check
// is "other" (request paths refuse those first; rewrite targets from the
// API server are not length-checked there). Pool and pod labels are
// bounded by the served pools, and deleted with them (PoolRemoved,
// EndpointsChanged); a namespace's names go when its last pool does.
type labelCap struct {
	limit *fairshare.Limit
	// revoke deletes the series of a name taken back from a namespace. It
	// is called without mu held.
	revoke func(namespace, name string)

	mu sync.RWMutex
	// admissions numbers every admission, so that a name taken back and
	// admitted again is not the admission a request labelled earlier.
	admissions uint64
	seen       map[string]*modelNames // by namespace
	desc       *prometheus.Desc
	reclaimed  *prometheus.CounterVec
}

// modelNames are one namespace's admitted names.
type modelNames struct {
	party *fairshare.Party
	// admitted maps each name to its admission's number; order lists the
	// names in admission order, the most recent last.
	admitted map[string]uint64
	order    []string
}

// label is a model label value and its admission (zero: a value not
// counted, which no revocation ends).
type label struct {
	value     string
	admission uint64
}

func newLabelCap(capacity, reservePercent int, revoke func(namespace, name string)) *labelCap {
	return &labelCap{
		limit: fairshare.New(fairshare.Options{Name: limitModelLabels, Flag: "max-model-labels", Unit: "model names",
			Capacity: int64(capacity), ReservePercent: reservePercent}),
		revoke: revoke,
		seen:   map[string]*modelNames{},
		desc:   prometheus.NewDesc("poolpicker_model_labels", "Distinct model names a namespace's requests use as metric label values now, of the --max-model-labels all namespaces share (names its pools' InferenceModelRewrites mention are not counted).", []string{"namespace"}, nil),
		reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolpicker_model_labels_reclaimed_total",
			Help: "Model names a namespace had borrowed beyond its share of --max-model-labels, taken back for a namespace within its share: their series were deleted and the namespace's later requests naming them count as \"other\".",
		}, []string{"namespace"}),
	}
}

// value is the label of model name v for a request of a pool in namespace
// ns with policy pol.
func (c *labelCap) value(ns, v string, pol *datastore.Policy) label {
	if v == "" {
		return label{}
	}
	c.mu.RLock()
	a, ok := c.seen[ns].get(v)
	c.mu.RUnlock()
	if ok {
		return label{v, a}
	}
	if !labelvalue.Valid(v, 0) {
		return label{value: otherLabel}
	}
	if pol.Mentions(v) {
		return label{value: v}
	}
	l, taken := c.admit(ns, v)
	if taken.value != "" {
		c.reclaimed.WithLabelValues(taken.ns).Inc()
		if c.revoke != nil {
			c.revoke(taken.ns, taken.value)
		}
	}
	return l
}

func (n *modelNames) get(v string) (uint64, bool) {
	if n == nil {
		return 0, false
	}
	a, ok := n.admitted[v]
	return a, ok
}

// takenBack is a name admit took back from a namespace.
type takenBack struct{ ns, value string }

// admit admits v for ns if its share allows, taking a borrowed name back
// from another namespace when ns is within its guarantee.
func (c *labelCap) admit(ns, v string) (label, takenBack) {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.seen[ns]
	if names == nil {
		names = &modelNames{party: c.limit.Party(ns, ""), admitted: map[string]uint64{}}
		c.seen[ns] = names
	}
	if a, ok := names.admitted[v]; ok {
		return label{v, a}, takenBack{}
	}
	var taken takenBack
	if err := names.party.Acquire(1); err != nil {
		// Within its guarantee a namespace is refused only when the
		// budget is spent; past it, it would borrow.
		var ex *fairshare.Exhausted
		if !errors.As(err, &ex) || ex.Held+1 > ex.Guaranteed {
			return label{value: otherLabel}, taken
		}
		if taken = c.takeBackLocked(ns); taken.value == "" || names.party.Acquire(1) != nil {
			return label{value: otherLabel}, taken
		}
	}
	c.admissions++
	names.admitted[v] = c.admissions
	names.order = append(names.order, v)
	return label{v, c.admissions}, taken
}

// takeBackLocked takes the most recently admitted name of the namespace,
// other than ns, that borrows most (of equal borrowers, the first by
// name, so that the same state always gives back the same name); none
// when no other borrows.
func (c *labelCap) takeBackLocked(ns string) takenBack {
	var from *modelNames
	var fromNS string
	var most int64
	for other, names := range c.seen {
		if other == ns {
			continue
		}
		if b := names.party.Borrowed(); b > most || b == most && b > 0 && other < fromNS {
			from, fromNS, most = names, other, b
		}
	}
	if from == nil {
		return takenBack{}
	}
	v := from.order[len(from.order)-1]
	from.order = from.order[:len(from.order)-1]
	delete(from.admitted, v)
	from.party.Release(1)
	return takenBack{fromNS, v}
}

// current reports whether l is still the admission of its name in ns: a
// request labelled before its name was taken back writes no more series
// of it.
func (c *labelCap) current(ns string, l label) bool {
	if l.admission == 0 {
		return true
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	a, ok := c.seen[ns].get(l.value)
	return ok && a == l.admission
}

// forget drops a namespace's names: its last pool is gone, and their
// series with it.
func (c *labelCap) forget(ns string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if names := c.seen[ns]; names != nil {
		names.party.Release(int64(len(names.admitted)))
		c.limit.Forget(ns, "")
		delete(c.seen, ns)
	}
	c.reclaimed.DeleteLabelValues(ns)
}

// Describe and Collect make the cap a prometheus.Collector of each
// namespace's count, its names taken back and its fair share.
func (c *labelCap) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	c.reclaimed.Describe(ch)
	c.limit.Describe(ch)
}

func (c *labelCap) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	for ns, names := range c.seen {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(len(names.admitted)), ns)
	}
	c.mu.RUnlock()
	c.reclaimed.Collect(ch)
	c.limit.Collect(ch)
}
