// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// PoolKey is the namespace/name of an InferencePool.
type PoolKey = types.NamespacedName

// PoolSpec is what the picker uses of an InferencePool's spec and metadata.
// Immutable once published.
type PoolSpec struct {
	// Selector is spec.selector.matchLabels.
	Selector map[string]string
	// TargetPorts is spec.targetPorts, in order.
	TargetPorts []int32
	// PickerService and PickerPort are spec.endpointPickerRef's Service name and
	// port: how gateways address this pool's picker (the stream's :authority).
	PickerService string
	PickerPort    int32
	// Annotations are the pool's annotations (profile choice, metrics settings).
	Annotations map[string]string
	// Generation is metadata.generation of the pool object this came from.
	Generation int64
}

// EndpointSet is an immutable snapshot of a pool's endpoints.
type EndpointSet struct {
	// Endpoints are sorted by address.
	Endpoints []*Endpoint
	byAddress map[string]*Endpoint
}

// Len is the number of endpoints.
func (s *EndpointSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Endpoints)
}

// Get returns the endpoint with address "ip:port", if in the set.
func (s *EndpointSet) Get(address string) (*Endpoint, bool) {
	if s == nil {
		return nil, false
	}
	e, ok := s.byAddress[address]
	return e, ok
}

var emptyEndpointSet = &EndpointSet{byAddress: map[string]*Endpoint{}}

// Pool is one served InferencePool: its spec, its endpoints, and whether its
// pod watch has synced. Reads are lock-free; writes are serialised by mu.
type Pool struct {
	Key PoolKey

	spec      atomic.Pointer[PoolSpec]
	endpoints atomic.Pointer[EndpointSet]
	synced    atomic.Bool
	syncError atomic.Pointer[string]
	policy    atomic.Pointer[Policy]

	mu       sync.Mutex // serialises writers of endpoints
	registry *Registry
	// sources is the last pod set given to SetPods, kept to recompute endpoints
	// when target ports change without a new watch.
	sources []EndpointSource
	removed atomic.Bool
	// lastRequest is when NoteRequest last recorded a request (Unix ns).
	lastRequest atomic.Int64
	// requests counts NoteRequest's calls.
	requests atomic.Uint64
}

// requestNoteGranularity is how stale LastRequest may be: a busy pool's
// requests write it (and tell the DemandObservers) at most this often, so
// they do not contend on one cache line.
const requestNoteGranularity = 100 * time.Millisecond

// NoteRequest records that a request for the pool arrived at now. When the
// last record is older than requestNoteGranularity, it is replaced and the
// registry's DemandObservers hear how long the pool was without requests:
// the first request after an idle spell is how the scraper learns to
// refresh the pool's metrics at once.
func (p *Pool) NoteRequest(now time.Time) {
	p.requests.Add(1)
	n := now.UnixNano()
	prev := p.lastRequest.Load()
	if n-prev < int64(requestNoteGranularity) || !p.lastRequest.CompareAndSwap(prev, n) {
		return
	}
	if p.registry == nil || p.removed.Load() {
		return
	}
	idle := time.Duration(math.MaxInt64)
	if prev != 0 {
		idle = time.Duration(n - prev)
	}
	for _, o := range p.registry.observerList() {
		if d, ok := o.(DemandObserver); ok {
			d.PoolDemanded(p, idle)
		}
	}
}

// Requests is the number of requests recorded for the pool: the scraper
// shares its budget between busy pools by their request rates.
func (p *Pool) Requests() uint64 { return p.requests.Load() }

// LastRequest is when a request for the pool was last recorded (within
// requestNoteGranularity); zero when none was.
func (p *Pool) LastRequest() time.Time {
	n := p.lastRequest.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Spec returns the current spec; never nil for a pool from the registry.
func (p *Pool) Spec() *PoolSpec { return p.spec.Load() }

// Endpoints returns the current endpoint snapshot; never nil.
func (p *Pool) Endpoints() *EndpointSet { return p.endpoints.Load() }

// Synced reports whether the pool's pod watch has listed at least once, so
// its endpoint set reflects the API server.
func (p *Pool) Synced() bool { return p.synced.Load() }

// SetSynced marks the pool's endpoint set as reflecting the API server.
func (p *Pool) SetSynced(v bool) { p.synced.Store(v) }

// SyncError says why the pool's pods could not be listed or watched (a
// missing permission, an API error), "" when nothing failed since the last
// successful list. A pool that never synced and has a SyncError is broken on
// its own: its requests are refused with this reason while other pools serve.
func (p *Pool) SyncError() string {
	if e := p.syncError.Load(); e != nil {
		return *e
	}
	return ""
}

// SetSyncError records why listing or watching the pool's pods failed; ""
// clears it.
func (p *Pool) SetSyncError(reason string) {
	if reason == "" {
		p.syncError.Store(nil)
		return
	}
	p.syncError.Store(&reason)
}

// Policy returns the pool's objectives and rewrites; never nil.
func (p *Pool) Policy() *Policy { return p.policy.Load() }

// SetPolicy publishes new objectives and rewrites for the pool.
func (p *Pool) SetPolicy(pol *Policy) {
	if pol == nil {
		pol = &Policy{}
	}
	p.policy.Store(pol)
}

// Removed reports whether the pool has left the registry; holders of a stale
// *Pool use it to stop work for the pool.
func (p *Pool) Removed() bool { return p.removed.Load() }

// SetPods replaces the pool's ready pods and recomputes its endpoints
// (pods × target ports) in one atomic swap: a reader sees the whole old set
// or the whole new one. Endpoints that stay keep their metrics and in-flight
// counts. Observers hear of the added and removed endpoints.
func (p *Pool) SetPods(pods []EndpointSource) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sources = slices.Clone(pods)
	p.rebuildLocked()
}

// setSpec publishes a new spec; a target-port change recomputes endpoints
// from the pods already known.
func (p *Pool) setSpec(spec *PoolSpec) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.spec.Swap(spec)
	if old == nil || !slices.Equal(old.TargetPorts, spec.TargetPorts) {
		p.rebuildLocked()
	}
}

func (p *Pool) rebuildLocked() {
	spec := p.spec.Load()
	old := p.endpoints.Load()
	next := &EndpointSet{byAddress: make(map[string]*Endpoint, len(p.sources)*len(spec.TargetPorts))}
	for _, src := range p.sources {
		if src.IP == "" {
			continue
		}
		for _, port := range spec.TargetPorts {
			addr := net.JoinHostPort(src.IP, strconv.Itoa(int(port)))
			if _, dup := next.byAddress[addr]; dup {
				continue
			}
			e := reuse(old, addr, src.UID)
			if e == nil {
				e = &Endpoint{Address: addr, IP: src.IP, Port: port, Pod: src.Pod, PodUID: src.UID, Labels: src.Labels, state: &endpointState{}}
			} else if !maps.Equal(e.Labels, src.Labels) {
				cp := *e
				cp.Labels = src.Labels
				e = &cp
			}
			next.byAddress[addr] = e
			next.Endpoints = append(next.Endpoints, e)
		}
	}
	slices.SortFunc(next.Endpoints, func(a, b *Endpoint) int {
		switch {
		case a.Address < b.Address:
			return -1
		case a.Address > b.Address:
			return 1
		}
		return 0
	})
	p.endpoints.Store(next)

	var added, removed []*Endpoint
	for _, e := range next.Endpoints {
		if o, ok := old.Get(e.Address); !ok || o.state != e.state {
			added = append(added, e)
		}
	}
	if old != nil {
		for _, e := range old.Endpoints {
			if n, ok := next.Get(e.Address); !ok || n.state != e.state {
				removed = append(removed, e)
			}
		}
	}
	if len(added)+len(removed) > 0 && p.registry != nil {
		p.registry.notifyEndpoints(p, added, removed)
	}
}

func reuse(old *EndpointSet, addr string, uid types.UID) *Endpoint {
	if e, ok := old.Get(addr); ok && e.PodUID == uid {
		return e
	}
	return nil
}
