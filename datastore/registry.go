// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Observer hears of endpoint and pool changes, synchronously and in order per
// pool. It must return quickly and must not call back into the pool's writers.
type Observer interface {
	// EndpointsChanged is called after a pool's endpoint set was swapped.
	EndpointsChanged(pool *Pool, added, removed []*Endpoint)
	// PoolRemoved is called after a pool left the registry, with its last endpoints.
	PoolRemoved(pool *Pool)
}

// DemandObserver is an Observer that also hears of requests: PoolDemanded
// is called from the request path, at most every 100 ms per pool, with how
// long the pool had been without requests. It must return at once and never
// wait on the network.
type DemandObserver interface {
	PoolDemanded(pool *Pool, idle time.Duration)
}

// PickerKey is how a gateway addresses a pool's picker: the namespace and
// Service name of spec.endpointPickerRef, and its port.
type PickerKey struct {
	Namespace string
	Service   string
	Port      int32
}

// registryView is an immutable view of the registry's pools and indexes.
type registryView struct {
	pools    map[PoolKey]*Pool
	ordered  []*Pool
	byPicker map[PickerKey][]*Pool
	// byService ignores the port, for authorities that carry none.
	byService map[PickerKey][]*Pool
}

// Registry maps pool keys to the pools this process serves. Lookups read an
// immutable view through one atomic load; writers build a new view.
type Registry struct {
	view atomic.Pointer[registryView]

	mu sync.Mutex // serialises writers of view
	// observers is replaced whole (copy on write) so that endpoint
	// notifications, which run under a pool's lock, never take mu: Upsert
	// holds mu while a target-port change rebuilds a pool's endpoints.
	observers atomic.Pointer[[]Observer]
	// byAddress maps an endpoint address to the pools holding it
	// (value: []*Pool, replaced whole), for resolving subset hints.
	byAddress sync.Map
	addrMu    sync.Mutex
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.view.Store(&registryView{pools: map[PoolKey]*Pool{}, byPicker: map[PickerKey][]*Pool{}, byService: map[PickerKey][]*Pool{}})
	return r
}

// AddObserver registers o for endpoint and pool changes. Call before pools exist.
func (r *Registry) AddObserver(o Observer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var next []Observer
	if cur := r.observers.Load(); cur != nil {
		next = slices.Clone(*cur)
	}
	next = append(next, o)
	r.observers.Store(&next)
}

func (r *Registry) observerList() []Observer {
	if cur := r.observers.Load(); cur != nil {
		return *cur
	}
	return nil
}

// Get returns the pool with the key.
func (r *Registry) Get(key PoolKey) (*Pool, bool) {
	p, ok := r.view.Load().pools[key]
	return p, ok
}

// Pools returns the served pools ordered by key; the slice must not be modified.
func (r *Registry) Pools() []*Pool { return r.view.Load().ordered }

// Len is the number of served pools.
func (r *Registry) Len() int { return len(r.view.Load().pools) }

// ByPicker returns the pools whose endpointPickerRef is the Service
// namespace/service; port 0 matches any port. The slice must not be modified.
func (r *Registry) ByPicker(namespace, service string, port int32) []*Pool {
	v := r.view.Load()
	if port == 0 {
		return v.byService[PickerKey{Namespace: namespace, Service: service}]
	}
	return v.byPicker[PickerKey{Namespace: namespace, Service: service, Port: port}]
}

// ByEndpoint returns the pools that hold an endpoint with the address
// "ip:port". The slice must not be modified.
func (r *Registry) ByEndpoint(address string) []*Pool {
	v, ok := r.byAddress.Load(address)
	if !ok {
		return nil
	}
	return v.([]*Pool)
}

// AllSynced reports whether every served pool's endpoints reflect the API server.
func (r *Registry) AllSynced() bool {
	for _, p := range r.Pools() {
		if !p.Synced() {
			return false
		}
	}
	return true
}

// Upsert adds the pool or updates its spec, and returns it. A new pool starts
// with no endpoints and not synced.
func (r *Registry) Upsert(key PoolKey, spec *PoolSpec) *Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.view.Load()
	p, ok := old.pools[key]
	if ok {
		prev := p.Spec()
		p.setSpec(spec)
		if prev.PickerService == spec.PickerService && prev.PickerPort == spec.PickerPort {
			return p
		}
	} else {
		p = &Pool{Key: key, registry: r}
		p.endpoints.Store(emptyEndpointSet)
		p.policy.Store(&Policy{})
		p.setSpec(spec)
	}
	if ok {
		// The pool's picker changed: re-index every pool (rare).
		pools := maps.Clone(old.pools)
		pools[key] = p
		r.view.Store(buildView(pools))
		return p
	}
	r.view.Store(old.withPool(p))
	return p
}

// withPool returns v with p, whose key v lacks, added. The ordered list and
// p's picker lists get p at its place instead of being sorted and indexed
// again: a start adds thousands of pools one by one, and a full rebuild
// each time made that quadratic.
func (v *registryView) withPool(p *Pool) *registryView {
	n := &registryView{pools: maps.Clone(v.pools), ordered: insertPool(v.ordered, p), byPicker: v.byPicker, byService: v.byService}
	n.pools[p.Key] = p
	if s := p.Spec(); s.PickerService != "" {
		pk := PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService, Port: s.PickerPort}
		sk := PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService}
		n.byPicker, n.byService = maps.Clone(v.byPicker), maps.Clone(v.byService)
		n.byPicker[pk] = insertPool(v.byPicker[pk], p)
		n.byService[sk] = insertPool(v.byService[sk], p)
	}
	return n
}

// insertPool returns a new slice of ps, ordered by key, with p at its place.
func insertPool(ps []*Pool, p *Pool) []*Pool {
	i, _ := slices.BinarySearchFunc(ps, p, comparePools)
	out := make([]*Pool, 0, len(ps)+1)
	out = append(out, ps[:i]...)
	out = append(out, p)
	return append(out, ps[i:]...)
}

// comparePools orders pools by namespace, then name.
func comparePools(a, b *Pool) int {
	if c := strings.Compare(a.Key.Namespace, b.Key.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Key.Name, b.Key.Name)
}

// Remove drops the pool; observers hear of it and its endpoints leave the
// address index. A no-op for an unknown key.
func (r *Registry) Remove(key PoolKey) {
	r.mu.Lock()
	old := r.view.Load()
	p, ok := old.pools[key]
	if !ok {
		r.mu.Unlock()
		return
	}
	pools := make(map[PoolKey]*Pool, len(old.pools))
	for k, v := range old.pools {
		if k != key {
			pools[k] = v
		}
	}
	r.view.Store(buildView(pools))
	r.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed.Store(true)
	p.synced.Store(false)
	r.indexAddresses(p, nil, p.Endpoints().Endpoints)
	for _, o := range r.observerList() {
		o.PoolRemoved(p)
	}
}

func buildView(pools map[PoolKey]*Pool) *registryView {
	v := &registryView{pools: pools, byPicker: map[PickerKey][]*Pool{}, byService: map[PickerKey][]*Pool{}}
	for _, p := range pools {
		v.ordered = append(v.ordered, p)
	}
	slices.SortFunc(v.ordered, comparePools)
	for _, p := range v.ordered {
		s := p.Spec()
		if s.PickerService == "" {
			continue
		}
		pk := PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService, Port: s.PickerPort}
		v.byPicker[pk] = append(v.byPicker[pk], p)
		sk := PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService}
		v.byService[sk] = append(v.byService[sk], p)
	}
	return v
}

// notifyEndpoints runs with p.mu held.
func (r *Registry) notifyEndpoints(p *Pool, added, removed []*Endpoint) {
	if p.removed.Load() {
		return
	}
	r.indexAddresses(p, added, removed)
	for _, o := range r.observerList() {
		o.EndpointsChanged(p, added, removed)
	}
}

func (r *Registry) indexAddresses(p *Pool, added, removed []*Endpoint) {
	r.addrMu.Lock()
	defer r.addrMu.Unlock()
	for _, e := range removed {
		if _, still := p.Endpoints().Get(e.Address); still && !p.removed.Load() {
			continue
		}
		cur := r.ByEndpoint(e.Address)
		next := slices.DeleteFunc(slices.Clone(cur), func(q *Pool) bool { return q == p })
		if len(next) == 0 {
			r.byAddress.Delete(e.Address)
		} else {
			r.byAddress.Store(e.Address, next)
		}
	}
	for _, e := range added {
		cur := r.ByEndpoint(e.Address)
		if slices.Contains(cur, p) {
			continue
		}
		r.byAddress.Store(e.Address, append(slices.Clone(cur), p))
	}
}
