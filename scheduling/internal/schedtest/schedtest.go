// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package schedtest builds real datastore pools, cycles over them and
// prompts for the tests of the scheduler and of the plugins that need a
// registry's events (the prefix index); it wraps frameworktest for what
// needs no datastore.
package schedtest

import (
	"fmt"
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
)

// Saturation thresholds of the scheduler's defaults, for NewCycle.
var Saturation = frameworktest.Saturation

// MetricsStaleness is the scheduler's default, for Candidates.
const MetricsStaleness = 2 * time.Second

// Pool is a real registry with one pool of n endpoints on port 8000, pod IPs
// 127.0.1.1 .. 127.0.1.n (endpoints sorted by address).
type Pool struct {
	Reg  *datastore.Registry
	Pool *datastore.Pool
	Pods []datastore.EndpointSource
}

// NewPool returns a synced pool of n endpoints whose registry tells
// observers of changes.
func NewPool(t testing.TB, n int, observers ...datastore.Observer) *Pool {
	t.Helper()
	reg := datastore.NewRegistry()
	for _, o := range observers {
		reg.AddObserver(o)
	}
	key := datastore.PoolKey{Namespace: "ns", Name: "pool"}
	pool := reg.Upsert(key, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}})
	tp := &Pool{Reg: reg, Pool: pool}
	for i := 1; i <= n; i++ {
		tp.Pods = append(tp.Pods, PodSource(i))
	}
	pool.SetPods(tp.Pods)
	pool.SetSynced(true)
	if got := pool.Endpoints().Len(); got != n {
		t.Fatalf("pool has %d endpoints, want %d", got, n)
	}
	return tp
}

// PodSource is pod i of a Pool (1-based).
func PodSource(i int) datastore.EndpointSource {
	return datastore.EndpointSource{
		Pod:    types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%03d", i)},
		UID:    types.UID(fmt.Sprintf("uid-%03d", i)),
		IP:     fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250),
		Labels: map[string]string{"app": "m"},
	}
}

// Ep returns the endpoint of pod i (1-based, as created).
func (tp *Pool) Ep(t testing.TB, i int) *datastore.Endpoint {
	t.Helper()
	src := PodSource(i)
	e, ok := tp.Pool.Endpoints().Get(src.IP + ":8000")
	if !ok {
		t.Fatalf("endpoint of pod %d not in pool", i)
	}
	return e
}

// SetAnnotation sets one annotation of the pool, as the controller would.
func (tp *Pool) SetAnnotation(key, v string) {
	spec := *tp.Pool.Spec()
	spec.Annotations = map[string]string{key: v}
	tp.Reg.Upsert(tp.Pool.Key, &spec)
}

// SetAll gives every endpoint of the pool a scrape from m.
func (tp *Pool) SetAll(m func() *datastore.Metrics) {
	for _, e := range tp.Pool.Endpoints().Endpoints {
		e.SetMetrics(m())
	}
}

// Load is a fresh scrape with the given queue and KV use.
func Load(waiting int, kv float64) *datastore.Metrics {
	return &datastore.Metrics{WaitingRequests: waiting, KVCacheUsage: kv, ScrapedAt: time.Now()}
}

// SeededRand is a deterministic source safe for concurrent use.
func SeededRand(seed uint64) func() uint64 { return frameworktest.SeededRand(seed) }

// NewCycle is a CycleState as the scheduler prepares it, for plugin tests.
func NewCycle(pool *datastore.Pool, model string, seed uint64) *framework.CycleState {
	cs := framework.NewCycleState(dsview.Pool(pool), Saturation, SeededRand(seed))
	cs.TargetModel = model
	return cs
}

// Candidates are the pool's endpoints with their metrics as the scheduler
// sees them (nil when stale under the default staleness).
func Candidates(pool *datastore.Pool) []framework.Candidate {
	var out []framework.Candidate
	now := time.Now()
	for i, e := range pool.Endpoints().Endpoints {
		m := e.Metrics()
		if !m.Fresh(now, MetricsStaleness) {
			m = nil
		}
		out = append(out, framework.Candidate{Endpoint: dsview.Endpoint(e), Metrics: dsview.Metrics(m), Index: i})
	}
	return out
}

// Prompt returns n bytes of deterministic text seeded by s.
func Prompt(s string, n int) []byte {
	b := make([]byte, 0, n)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%s-%d ", s, i)
	}
	return b[:n]
}

// Build is the plugin a factory makes from params as a config gives them
// (empty: none), named after its type.
func Build(t testing.TB, typ string, f framework.Factory, params string) framework.Plugin {
	t.Helper()
	return frameworktest.Build(t, f, typ, params)
}

// ApproxEqual reports whether two score vectors agree within rounding.
func ApproxEqual(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

// Observer has o hear of reg's endpoint and pool changes through views,
// as a scheduler tells its plugins.
func Observer(o framework.PoolObserver) datastore.Observer { return observer{o} }

type observer struct{ o framework.PoolObserver }

func (a observer) EndpointsChanged(pool *datastore.Pool, added, removed []*datastore.Endpoint) {
	a.o.EndpointsChanged(dsview.Pool(pool), dsview.Endpoints(added), dsview.Endpoints(removed))
}

func (a observer) PoolRemoved(pool *datastore.Pool) { a.o.PoolRemoved(dsview.Pool(pool)) }
