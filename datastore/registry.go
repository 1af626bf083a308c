// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"hash/maphash"
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

// registryView is an immutable view of the registry's pools and indexes,
// each split into viewShards maps by key: a writer copies the view's shard
// arrays and the one shard of each that it changes, so a start that adds
// ten thousand pools one by one copies a few dozen entries each time, not
// every pool.
type registryView struct {
	n         int
	pools     [viewShards]map[PoolKey]*Pool
	byPicker  [viewShards]map[PickerKey][]*Pool
	byService [viewShards]map[PickerKey][]*Pool // the port ignored, for authorities that carry none

	// ordered is every pool in key order, sorted on the first call of
	// Pools after a change.
	orderOnce sync.Once
	ordered   []*Pool
}

// viewShards is the number of shards of each of a view's maps.
const viewShards = 256

var shardSeed = maphash.MakeSeed()

func shardOf[K comparable](k K) int { return int(maphash.Comparable(shardSeed, k) % viewShards) }

func (v *registryView) pool(key PoolKey) (*Pool, bool) {
	p, ok := v.pools[shardOf(key)][key]
	return p, ok
}

// clone copies v's shard arrays (not the shards): the writer replaces the
// shards it changes.
func (v *registryView) clone() *registryView {
	return &registryView{n: v.n, pools: v.pools, byPicker: v.byPicker, byService: v.byService}
}

// setPool puts p under its key, or removes the key when p is nil.
func (v *registryView) setPool(key PoolKey, p *Pool) {
	i := shardOf(key)
	m := maps.Clone(v.pools[i])
	if m == nil {
		m = map[PoolKey]*Pool{}
	}
	_, had := m[key]
	if p == nil {
		delete(m, key)
		if had {
			v.n--
		}
	} else {
		m[key] = p
		if !had {
			v.n++
		}
	}
	v.pools[i] = m
}

// pickerKeys are the keys of p's picker indexes; ok is false when its spec
// names no picker.
func pickerKeys(p *Pool, s *PoolSpec) (pk, sk PickerKey, ok bool) {
	if s.PickerService == "" {
		return PickerKey{}, PickerKey{}, false
	}
	return PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService, Port: s.PickerPort},
		PickerKey{Namespace: p.Key.Namespace, Service: s.PickerService}, true
}

// index adds p (add) to, or removes it from, the picker lists of spec s.
func (v *registryView) index(p *Pool, s *PoolSpec, add bool) {
	pk, sk, ok := pickerKeys(p, s)
	if !ok {
		return
	}
	edit := func(shards *[viewShards]map[PickerKey][]*Pool, k PickerKey) {
		i := shardOf(k)
		m := maps.Clone(shards[i])
		if m == nil {
			m = map[PickerKey][]*Pool{}
		}
		if add {
			m[k] = insertPool(m[k], p)
		} else if ps := slices.DeleteFunc(slices.Clone(m[k]), func(q *Pool) bool { return q == p }); len(ps) > 0 {
			m[k] = ps
		} else {
			delete(m, k)
		}
		shards[i] = m
	}
	edit(&v.byPicker, pk)
	edit(&v.byService, sk)
}

// sorted is every pool in key order.
func (v *registryView) sorted() []*Pool {
	v.orderOnce.Do(func() {
		v.ordered = make([]*Pool, 0, v.n)
		for _, m := range v.pools {
			for _, p := range m {
				v.ordered = append(v.ordered, p)
			}
		}
		slices.SortFunc(v.ordered, comparePools)
	})
	return v.ordered
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
	// loadObservers hear of every lease's change (AddLoadObserver), copy
	// on write as observers.
	loadObservers atomic.Pointer[[]LoadObserver]
	// byAddress maps an endpoint address to the pools holding it
	// (value: []*Pool, replaced whole), for resolving subset hints.
	byAddress sync.Map
	addrMu    sync.Mutex
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.view.Store(&registryView{})
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
	return r.view.Load().pool(key)
}

// Pools returns the served pools ordered by key; the slice must not be modified.
func (r *Registry) Pools() []*Pool { return r.view.Load().sorted() }

// Len is the number of served pools.
func (r *Registry) Len() int { return r.view.Load().n }

// ByPicker returns the pools whose endpointPickerRef is the Service
// namespace/service; port 0 matches any port. The slice must not be modified.
func (r *Registry) ByPicker(namespace, service string, port int32) []*Pool {
	v := r.view.Load()
	if port == 0 {
		k := PickerKey{Namespace: namespace, Service: service}
		return v.byService[shardOf(k)][k]
	}
	k := PickerKey{Namespace: namespace, Service: service, Port: port}
	return v.byPicker[shardOf(k)][k]
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
	for _, m := range r.view.Load().pools {
		for _, p := range m {
			if !p.Synced() {
				return false
			}
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
	p, ok := old.pool(key)
	if ok {
		prev := p.Spec()
		p.setSpec(spec)
		if prev.PickerService == spec.PickerService && prev.PickerPort == spec.PickerPort {
			return p
		}
		// The pool's picker changed: it moves between picker lists.
		next := old.clone()
		next.index(p, prev, false)
		next.index(p, spec, true)
		r.view.Store(next)
		return p
	}
	p = &Pool{Key: key, registry: r}
	p.endpoints.Store(emptyEndpointSet)
	p.policy.Store(&Policy{})
	p.setSpec(spec)
	next := old.clone()
	next.setPool(key, p)
	next.index(p, spec, true)
	r.view.Store(next)
	return p
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
	p, ok := old.pool(key)
	if !ok {
		r.mu.Unlock()
		return
	}
	next := old.clone()
	next.setPool(key, nil)
	next.index(p, p.Spec(), false)
	r.view.Store(next)
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
