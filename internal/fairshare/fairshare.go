// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package fairshare divides a process-wide limit (streams, bytes, blocks)
// between namespaces, the tenants, and within each namespace between its
// pools, so that what one pool or tenant holds never takes another's
// guaranteed share.
//
// The rule follows Kubernetes' API Priority and Fairness (nominal seats,
// lending, borrowing), with the parties found at run time instead of
// configured: a party is active while it holds something. Of a limit of
// capacity C with a reserve R kept for parties not yet active, each active
// namespace is guaranteed (C-R)/N (N active namespaces, counting the one
// asking), and each active pool of a namespace an equal part of its
// namespace's guarantee. A request within its pool's and namespace's
// guarantee is granted while the limit has room; one within its pool's
// guarantee whose namespace's other pools borrow, while what stays free
// covers the other namespaces' unused guarantees. Beyond its pool's
// guarantee a request borrows: granted only if what stays free still covers
// the reserve and the unused guarantee of every other active namespace and
// of the namespace's other active pools. Nothing held is taken back (there
// is no preemption): a party that turns active gets the reserve at once and
// its full guarantee as borrowers give back.
//
// Capacity zero or less means no limit: everything is granted and counted.
package fairshare

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultReservePercent is the part of a limit kept for parties that are
// not active yet, so that a pool that turns active is served at once even
// while others borrow everything else.
const DefaultReservePercent = 10

// Options configures a Limit.
type Options struct {
	// Name names the limit in metrics (label limit) and refusals, e.g.
	// "held_request_body_bytes".
	Name string
	// Flag is the flag that sets Capacity, named in refusals.
	Flag string
	// Unit is what Capacity counts, in refusals ("bytes", "streams").
	Unit string
	// Capacity is the process-wide limit. Zero or less: no limit.
	Capacity int64
	// ReservePercent of Capacity is kept for parties not yet active. Zero:
	// DefaultReservePercent; negative: none.
	ReservePercent int
}

// Limit is one process-wide limit shared fairly; it is a
// prometheus.Collector of its per-pool use. Safe for concurrent use.
type Limit struct {
	opts     Options
	capacity int64
	reserve  int64

	mu         sync.Mutex
	total      int64
	namespaces map[string]*namespace
	// active are the namespaces holding something, for the borrow check.
	active   map[*namespace]struct{}
	unshared *Party

	capDesc, usedDesc, guarDesc, rejDesc *prometheus.Desc
}

type namespace struct {
	name   string
	used   int64
	pools  map[string]*Party
	active map[*Party]struct{}
}

// Party is one pool's account in a Limit; callers keep it and Acquire and
// Release through it.
type Party struct {
	l        *Limit
	ns       *namespace
	name     string
	used     int64
	rejected float64
	// forgotten: the pool is gone; the account is dropped when it is empty.
	forgotten bool
	// dropped: the account left its namespace. A holder that took it
	// before (a stream that resolved its pool just before the pool went)
	// charges the pool's account of now instead (live), so that a name
	// never has two accounts nor its namespace two entries in active.
	dropped bool
	// unshared: the account of what is not any pool's yet (Unshared); it
	// is never active and has no share.
	unshared bool
}

// New returns a limit.
func New(o Options) *Limit {
	if o.ReservePercent == 0 {
		o.ReservePercent = DefaultReservePercent
	}
	l := &Limit{opts: o, capacity: o.Capacity, namespaces: map[string]*namespace{}, active: map[*namespace]struct{}{}}
	if o.ReservePercent > 0 && o.Capacity > 0 {
		l.reserve = o.Capacity * int64(min(o.ReservePercent, 100)) / 100
	}
	constLabels := prometheus.Labels{"limit": o.Name}
	l.capDesc = prometheus.NewDesc("poolpicker_fair_share_capacity", "A process-wide limit shared fairly between namespaces and pools (0: no limit), and its reserve for parties not yet active.", []string{"kind"}, constLabels)
	l.usedDesc = prometheus.NewDesc("poolpicker_fair_share_used", "What a pool holds now of a fairly shared limit (namespace and pool empty: streams whose pool is not known yet).", []string{"namespace", "pool"}, constLabels)
	l.guarDesc = prometheus.NewDesc("poolpicker_fair_share_guaranteed", "A pool's guaranteed share of the limit now, given the pools and namespaces active; it may borrow beyond it what others leave idle.", []string{"namespace", "pool"}, constLabels)
	l.rejDesc = prometheus.NewDesc("poolpicker_fair_share_rejections_total", "Requests of a pool refused because the pool could get no more of the limit.", []string{"namespace", "pool"}, constLabels)
	return l
}

// Unshared returns the account of what belongs to no pool yet (a stream
// before its headers name its pool): charged against the capacity alone
// (AcquireUnshared), never counted as an active party, and moved to its
// pool's account (MoveTo) once that is known. Its series have empty
// namespace and pool labels.
func (l *Limit) Unshared() *Party {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unshared == nil {
		l.unshared = &Party{l: l, ns: &namespace{pools: map[string]*Party{}, active: map[*Party]struct{}{}}, unshared: true}
	}
	return l.unshared
}

// Party returns the account of pool in namespace, made on first use.
func (l *Limit) Party(namespaceName, pool string) *Party {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, _ := l.partyLocked(namespaceName, pool)
	p.forgotten = false
	return p
}

// PartyWhile is Party for a holder that found its pool served, which
// the pool's Forget may have overtaken since: served, called under the
// limit's lock, says whether the pool still is. When it is not, the
// account is not revived (nothing would forget it again): the holder gets
// the pool's account as it is, or, when there is none, a handle whose
// charges go to an account dropped once they are given back.
func (l *Limit) PartyWhile(namespaceName, pool string, served func() bool) *Party {
	l.mu.Lock()
	defer l.mu.Unlock()
	if served() {
		p, _ := l.partyLocked(namespaceName, pool)
		p.forgotten = false
		return p
	}
	if ns := l.namespaces[namespaceName]; ns != nil {
		if p := ns.pools[pool]; p != nil {
			return p
		}
	}
	return &Party{l: l, ns: &namespace{name: namespaceName}, name: pool, forgotten: true, dropped: true}
}

func (l *Limit) partyLocked(namespaceName, pool string) (p *Party, made bool) {
	ns := l.namespaces[namespaceName]
	if ns == nil {
		ns = &namespace{name: namespaceName, pools: map[string]*Party{}, active: map[*Party]struct{}{}}
		l.namespaces[namespaceName] = ns
	}
	if p = ns.pools[pool]; p != nil {
		return p, false
	}
	p = &Party{l: l, ns: ns, name: pool}
	ns.pools[pool] = p
	return p, true
}

// liveLocked is the account p's charges go to: p, or, once p was dropped,
// its pool's account of now, made forgotten (its pool is gone unless it
// comes back) when there is none.
func (l *Limit) liveLocked(p *Party) *Party {
	if !p.dropped {
		return p
	}
	q, made := l.partyLocked(p.ns.name, p.name)
	if made {
		q.forgotten = true
	}
	return q
}

// Forget drops pool's account once it holds nothing (now, or when its last
// Release comes): the pool is no longer served.
func (l *Limit) Forget(namespaceName, pool string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.namespaces[namespaceName]
	if ns == nil {
		return
	}
	if p := ns.pools[pool]; p != nil {
		p.forgotten = true
		l.dropLocked(p)
	}
}

func (l *Limit) dropLocked(p *Party) {
	if !p.forgotten || p.used != 0 {
		return
	}
	ns := p.ns
	if ns.pools[p.name] == p {
		delete(ns.pools, p.name)
	}
	p.dropped = true
	if len(ns.pools) == 0 && l.namespaces[ns.name] == ns {
		delete(l.namespaces, ns.name)
	}
}

// Exhausted is the refusal of an Acquire: the pool could get no more.
type Exhausted struct {
	Limit, Flag, Unit   string
	Namespace, Pool     string
	Capacity, Held      int64
	Guaranteed, Request int64
}

func (e *Exhausted) Error() string {
	return "pool " + e.Namespace + "/" + e.Pool + " holds " + strconv.FormatInt(e.Held, 10) + " " + e.Unit + " and its guaranteed share is " +
		strconv.FormatInt(e.Guaranteed, 10) + " of the " + strconv.FormatInt(e.Capacity, 10) +
		" set by --" + e.Flag + " (" + e.Limit + "), which other pools hold the rest of; retry later"
}

// Acquire charges n to p if its share allows, else returns an *Exhausted
// and charges nothing.
func (p *Party) Acquire(n int64) error {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	p = l.liveLocked(p)
	if l.capacity <= 0 || l.grantableLocked(p, n) {
		p.addLocked(n)
		return nil
	}
	p.rejected++
	nsShare, poolShare := l.sharesLocked(p)
	defer l.dropLocked(p) // a gone pool's account made for this charge
	return &Exhausted{Limit: l.opts.Name, Flag: l.opts.Flag, Unit: l.opts.Unit, Namespace: p.ns.name, Pool: p.name,
		Capacity: l.capacity, Held: p.used, Guaranteed: min(nsShare, poolShare), Request: n}
}

// AcquireUnshared charges n to p against the limit's capacity alone, with
// no share checked (for a stream whose pool is not known yet); false
// means the limit is spent and nothing was charged.
func (p *Party) AcquireUnshared(n int64) bool {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.capacity > 0 && l.total+n > l.capacity {
		p.rejected++
		return false
	}
	p.addLocked(n)
	return true
}

// MoveTo moves n of p's charge to to, if to's share allows; else it
// returns an *Exhausted and the charge stays with p.
func (p *Party) MoveTo(to *Party, n int64) error {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	p, to = l.liveLocked(p), l.liveLocked(to)
	p.addLocked(-n)
	if l.capacity <= 0 || l.grantableLocked(to, n) {
		to.addLocked(n)
		return nil
	}
	p.addLocked(n)
	to.rejected++
	nsShare, poolShare := l.sharesLocked(to)
	defer l.dropLocked(to) // a gone pool's account made for this charge
	return &Exhausted{Limit: l.opts.Name, Flag: l.opts.Flag, Unit: l.opts.Unit, Namespace: to.ns.name, Pool: to.name,
		Capacity: l.capacity, Held: to.used, Guaranteed: min(nsShare, poolShare), Request: n}
}

// Release gives back n of what p holds.
func (p *Party) Release(n int64) {
	if n == 0 {
		return
	}
	l := p.l
	l.mu.Lock()
	p = l.liveLocked(p)
	p.addLocked(-n)
	l.dropLocked(p)
	l.mu.Unlock()
}

// Held is what p holds now (its pool's account of now, once p was dropped).
func (p *Party) Held() int64 {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !p.dropped {
		return p.used
	}
	if ns := l.namespaces[p.ns.name]; ns != nil {
		if q := ns.pools[p.name]; q != nil {
			return q.used
		}
	}
	return 0
}

// Borrowed is what p holds beyond its guaranteed share now, given the
// pools and namespaces active: what it would give back first to a party
// owed its guarantee, for a resource its holder never releases by itself.
func (p *Party) Borrowed() int64 {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.capacity <= 0 || p.unshared {
		return 0
	}
	nsShare, poolShare := l.sharesLocked(p)
	return max(0, p.used-min(nsShare, poolShare))
}

func (p *Party) addLocked(n int64) {
	l, ns := p.l, p.ns
	was, nsWas := p.used, ns.used
	p.used += n
	ns.used += n
	l.total += n
	if p.unshared {
		return
	}
	switch {
	case was == 0 && p.used != 0:
		ns.active[p] = struct{}{}
	case was != 0 && p.used == 0:
		delete(ns.active, p)
	}
	switch {
	case nsWas == 0 && ns.used != 0:
		l.active[ns] = struct{}{}
	case nsWas != 0 && ns.used == 0:
		delete(l.active, ns)
	}
}

// sharesLocked is p's namespace's guaranteed share and p's own, counting
// both as active.
func (l *Limit) sharesLocked(p *Party) (nsShare, poolShare int64) {
	nss := int64(len(l.active))
	if _, ok := l.active[p.ns]; !ok {
		nss++
	}
	pools := int64(len(p.ns.active))
	if _, ok := p.ns.active[p]; !ok {
		pools++
	}
	nsShare = (l.capacity - l.reserve) / nss
	return nsShare, nsShare / pools
}

// grantableLocked is the rule of the package comment.
func (l *Limit) grantableLocked(p *Party, n int64) bool {
	if l.total+n > l.capacity {
		return false
	}
	nsShare, poolShare := l.sharesLocked(p)
	poolWithin, nsWithin := p.used+n <= poolShare, p.ns.used+n <= nsShare
	if poolWithin && nsWithin {
		return true // within its guarantee
	}
	free := l.capacity - l.total - n
	// Other namespaces keep their unused guarantee whatever this one does.
	var owed int64
	for ns := range l.active {
		if ns != p.ns && ns.used < nsShare {
			owed += nsShare - ns.used
		}
	}
	if poolWithin {
		// The pool is within its own guarantee while its namespace's other
		// pools borrow (or it is new): it may have the reserve.
		return free >= owed
	}
	// The pool borrows: what stays free must also cover the reserve and
	// the unused guarantee of the namespace's other pools.
	owed += l.reserve
	for q := range p.ns.active {
		if q != p && q.used < poolShare {
			owed += poolShare - q.used
		}
	}
	return free >= owed
}

// Describe implements prometheus.Collector.
func (l *Limit) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.capDesc
	ch <- l.usedDesc
	ch <- l.guarDesc
	ch <- l.rejDesc
}

// Collect implements prometheus.Collector: one series per pool account.
func (l *Limit) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(l.capDesc, prometheus.GaugeValue, float64(max(l.capacity, 0)), "capacity")
	ch <- prometheus.MustNewConstMetric(l.capDesc, prometheus.GaugeValue, float64(l.reserve), "reserve")
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.unshared; p != nil {
		ch <- prometheus.MustNewConstMetric(l.usedDesc, prometheus.GaugeValue, float64(p.used), "", "")
		ch <- prometheus.MustNewConstMetric(l.rejDesc, prometheus.CounterValue, p.rejected, "", "")
	}
	for _, ns := range l.namespaces {
		for _, p := range ns.pools {
			ch <- prometheus.MustNewConstMetric(l.usedDesc, prometheus.GaugeValue, float64(p.used), ns.name, p.name)
			ch <- prometheus.MustNewConstMetric(l.rejDesc, prometheus.CounterValue, p.rejected, ns.name, p.name)
			if l.capacity > 0 {
				nsShare, poolShare := l.sharesLocked(p)
				ch <- prometheus.MustNewConstMetric(l.guarDesc, prometheus.GaugeValue, float64(min(nsShare, poolShare)), ns.name, p.name)
			}
		}
	}
}

// Total is what every party holds now.
func (l *Limit) Total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Capacity is Options.Capacity.
func (l *Limit) Capacity() int64 { return l.capacity }
