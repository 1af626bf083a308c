// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

var ready = func(ip string) podState { return podState{ip: ip, ready: true} }

func TestPodsExistBeforePool(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "before")
		sel := map[string]string{"app": "llama"}
		createPod(t, ns, "a", sel, ready("10.1.0.1"))
		createPod(t, ns, "b", sel, ready("10.1.0.2"))
		createPod(t, ns, "not-ready", sel, podState{ip: "10.1.0.3"})
		createPod(t, ns, "no-ip", sel, podState{ready: true})
		createPod(t, ns, "other-app", map[string]string{"app": "mistral"}, ready("10.1.0.4"))

		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", sel, []int32{8000, 8001})
		r.waitEndpoints(t, key, "10.1.0.1:8000", "10.1.0.1:8001", "10.1.0.2:8000", "10.1.0.2:8001")
		if got := r.metric("inference_pool_ready_pods", ns, "pool"); got != 2 {
			t.Errorf("inference_pool_ready_pods = %v, want 2", got)
		}
		if got := r.metric("poolpicker_served_pools"); got != 1 {
			t.Errorf("poolpicker_served_pools = %v, want 1", got)
		}
	})
}

// TestSelectorChangeSwapsAtomically changes a pool's selector to a disjoint
// set of pods while readers spin on the datastore: every read must be the
// whole old set or the whole new set, and the old watch must stop.
func TestSelectorChangeSwapsAtomically(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "swap")
		blue, green := map[string]string{"color": "blue"}, map[string]string{"color": "green"}
		var wantBlue, wantGreen []string
		for i := range 5 {
			createPod(t, ns, fmt.Sprintf("blue-%d", i), blue, ready(fmt.Sprintf("10.2.0.%d", i+1)))
			createPod(t, ns, fmt.Sprintf("green-%d", i), green, ready(fmt.Sprintf("10.2.1.%d", i+1)))
			wantBlue = append(wantBlue, fmt.Sprintf("10.2.0.%d:8000", i+1))
			wantGreen = append(wantGreen, fmt.Sprintf("10.2.1.%d:8000", i+1))
		}
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", blue, []int32{8000})
		r.waitEndpoints(t, key, wantBlue...)

		var stop atomic.Bool
		var reads, sawGreen atomic.Int64
		var mu sync.Mutex
		var bad [][]string
		var wg sync.WaitGroup
		greenSeen := make(chan struct{})
		var once sync.Once
		for range 2 {
			wg.Go(func() {
				for !stop.Load() {
					p, ok := r.reg.Get(key)
					var got []string
					if ok {
						got = addrs(p.Endpoints())
					}
					switch {
					case slices.Equal(got, wantBlue):
					case slices.Equal(got, wantGreen):
						sawGreen.Add(1)
						once.Do(func() { close(greenSeen) })
					default:
						mu.Lock()
						if len(bad) < 5 {
							bad = append(bad, got)
						}
						mu.Unlock()
					}
					reads.Add(1)
				}
			})
		}
		updatePool(t, key, func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"color": "green"}
		})
		r.waitEndpoints(t, key, wantGreen...)
		select {
		case <-greenSeen:
		case <-time.After(waitTimeout):
		}
		stop.Store(true)
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("%d reads; reads that were neither the whole old nor the whole new set: %v", reads.Load(), bad)
		}
		if sawGreen.Load() == 0 {
			t.Fatal("readers never saw the new set")
		}
		// The old watch stops once the new set is published.
		r.waitFor(t, "one pod watch running", func() bool { return r.metric("poolpicker_pod_watches") == 1 })
		if got := r.metric("poolpicker_pool_watch_starts_total", ns, "pool"); got != 2 {
			t.Errorf("watch starts = %v, want 2", got)
		}
		// The new watch follows the new selector; blue pods are not seen any more.
		createPod(t, ns, "green-new", green, ready("10.2.1.9"))
		createPod(t, ns, "blue-new", blue, ready("10.2.0.9"))
		r.waitEndpoints(t, key, append(slices.Clone(wantGreen), "10.2.1.9:8000")...)
	})
}

func TestTargetPortsChangeNeedsNoNewWatch(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "ports")
		sel := map[string]string{"app": "m"}
		createPod(t, ns, "a", sel, ready("10.3.0.1"))
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", sel, []int32{8000})
		r.waitEndpoints(t, key, "10.3.0.1:8000")
		updatePool(t, key, func(p *v1.InferencePool) {
			p.Spec.TargetPorts = []v1.Port{{Number: 9000}, {Number: 9001}}
		})
		r.waitEndpoints(t, key, "10.3.0.1:9000", "10.3.0.1:9001")
		if got := r.metric("poolpicker_pool_watch_starts_total", ns, "pool"); got != 1 {
			t.Errorf("watch starts = %v, want 1", got)
		}
	})
}

// TestRestart stops the picker, changes pods while it is down, and starts a
// new one with an empty datastore: it must list afresh, not wait for events.
func TestRestart(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "restart")
		sel := map[string]string{"app": "m"}
		createPod(t, ns, "a", sel, ready("10.4.0.1"))
		b := createPod(t, ns, "b", sel, ready("10.4.0.2"))
		createPod(t, ns, "c", sel, ready("10.4.0.3"))
		createPool(t, ns, "one", sel, []int32{8000})
		createPool(t, ns, "two", map[string]string{"app": "other"}, []int32{8000})
		createPod(t, ns, "d", map[string]string{"app": "other"}, ready("10.4.1.1"))
		one, two := datastore.PoolKey{Namespace: ns, Name: "one"}, datastore.PoolKey{Namespace: ns, Name: "two"}

		first := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		first.waitEndpoints(t, one, "10.4.0.1:8000", "10.4.0.2:8000", "10.4.0.3:8000")
		first.waitEndpoints(t, two, "10.4.1.1:8000")
		first.stop(t)

		deletePod(t, ns, "c")
		setPodStatus(t, b, "10.4.0.2", false)
		createPod(t, ns, "e", sel, ready("10.4.0.5"))

		second := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		second.waitEndpoints(t, one, "10.4.0.1:8000", "10.4.0.5:8000")
		second.waitEndpoints(t, two, "10.4.1.1:8000")
		second.waitFor(t, "HasSynced", second.parts.InitialSync.HasSynced)
	})
}

func TestPoolDeletedAndRecreated(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "recreate")
		createPod(t, ns, "a", map[string]string{"app": "a"}, ready("10.5.0.1"))
		createPod(t, ns, "b", map[string]string{"app": "b"}, ready("10.5.0.2"))
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", map[string]string{"app": "a"}, []int32{8000})
		r.waitEndpoints(t, key, "10.5.0.1:8000")
		first, _ := r.reg.Get(key)

		deletePool(t, key)
		r.waitGone(t, key)
		if !first.Removed() {
			t.Fatal("the deleted pool's datastore entry is not marked removed")
		}
		r.waitFor(t, "no pod watch running", func() bool { return r.metric("poolpicker_pod_watches") == 0 })
		if got := r.metric("poolpicker_served_pools"); got != 0 {
			t.Errorf("served pools = %v after delete", got)
		}

		createPool(t, ns, "pool", map[string]string{"app": "b"}, []int32{8080})
		r.waitEndpoints(t, key, "10.5.0.2:8080")
		if second, _ := r.reg.Get(key); second == first {
			t.Fatal("the recreated pool reuses the removed datastore entry")
		}
	})
}

func TestPodLifecycle(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "lifecycle")
		sel := map[string]string{"app": "m"}
		a := createPod(t, ns, "a", sel, ready("10.6.0.1"))
		createPod(t, ns, "b", sel, podState{ip: "10.6.0.2", ready: true, finalizers: []string{testFinalizer}})
		createPod(t, ns, "c", sel, ready("10.6.0.3"))
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", sel, []int32{8000})
		r.waitEndpoints(t, key, "10.6.0.1:8000", "10.6.0.2:8000", "10.6.0.3:8000")

		steps := []struct {
			name string
			do   func()
			want []string
		}{
			{"pod loses Ready", func() { setPodStatus(t, a, "10.6.0.1", false) }, []string{"10.6.0.2:8000", "10.6.0.3:8000"}},
			{"pod regains Ready", func() { setPodStatus(t, a, "10.6.0.1", true) }, []string{"10.6.0.1:8000", "10.6.0.2:8000", "10.6.0.3:8000"}},
			{"pod gains a deletion timestamp (held by a finalizer)", func() { deletePod(t, ns, "b") }, []string{"10.6.0.1:8000", "10.6.0.3:8000"}},
			{"terminating pod finally goes", func() { removeFinalizers(t, ns, "b") }, []string{"10.6.0.1:8000", "10.6.0.3:8000"}},
			{"pod deleted", func() { deletePod(t, ns, "c") }, []string{"10.6.0.1:8000"}},
			{"pod labels no longer match", func() {
				var pod = a.DeepCopy()
				if err := env.Client.Get(ctx(t), clientKey(pod), pod); err != nil {
					t.Fatal(err)
				}
				pod.Labels = map[string]string{"app": "elsewhere"}
				if err := env.Client.Update(ctx(t), pod); err != nil {
					t.Fatal(err)
				}
			}, nil},
		}
		for _, st := range steps {
			st.do()
			r.waitEndpoints(t, key, st.want...)
		}
	})
}

// TestOtherNamespaceNeverIncluded: pods with matching labels in another
// namespace are not the pool's, and are never even sent to the picker.
func TestOtherNamespaceNeverIncluded(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns, other := env.Namespace(t, "home"), env.Namespace(t, "away")
		sel := map[string]string{"app": "shared-name"}
		createPod(t, other, "x", sel, ready("10.7.1.1"))
		createPod(t, ns, "a", sel, ready("10.7.0.1"))
		r := start(t, nil, Options{PodWatchPlan: plan})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", sel, []int32{8000})
		r.waitEndpoints(t, key, "10.7.0.1:8000")
		createPod(t, other, "y", sel, ready("10.7.1.2"))
		createPod(t, ns, "b", sel, ready("10.7.0.2"))
		// b's arrival proves the watch is live; x and y must still be absent.
		r.waitEndpoints(t, key, "10.7.0.1:8000", "10.7.0.2:8000")
		for _, addr := range []string{"10.7.1.1:8000", "10.7.1.2:8000"} {
			if pools := r.reg.ByEndpoint(addr); len(pools) != 0 {
				t.Errorf("%s from another namespace is in pools %v", addr, pools)
			}
		}
	})
}

func TestOverlappingSelectorsShareAPod(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "overlap")
		createPod(t, ns, "both", map[string]string{"app": "m", "tier": "gold"}, ready("10.8.0.1"))
		createPod(t, ns, "wide-only", map[string]string{"app": "m"}, ready("10.8.0.2"))
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		wide, narrow := datastore.PoolKey{Namespace: ns, Name: "wide"}, datastore.PoolKey{Namespace: ns, Name: "narrow"}
		createPool(t, ns, "wide", map[string]string{"app": "m"}, []int32{8000})
		createPool(t, ns, "narrow", map[string]string{"app": "m", "tier": "gold"}, []int32{8000})
		r.waitEndpoints(t, wide, "10.8.0.1:8000", "10.8.0.2:8000")
		r.waitEndpoints(t, narrow, "10.8.0.1:8000")
		var names []string
		for _, p := range r.reg.ByEndpoint("10.8.0.1:8000") {
			names = append(names, p.Key.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"narrow", "wide"}) {
			t.Fatalf("ByEndpoint(shared pod) = %v, want both pools", names)
		}
		deletePod(t, ns, "both")
		r.waitEndpoints(t, wide, "10.8.0.2:8000")
		r.waitEndpoints(t, narrow)
	})
}

func TestPoolLeavesServedSetByLabel(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "shard")
		createPod(t, ns, "a", map[string]string{"app": "m"}, ready("10.9.0.1"))
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}, PoolSelector: "shard=a"})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000}, withLabels(map[string]string{"shard": "a"}))
		createPool(t, ns, "elsewhere", map[string]string{"app": "m"}, []int32{8000}, withLabels(map[string]string{"shard": "b"}))
		r.waitEndpoints(t, key, "10.9.0.1:8000")
		if _, ok := r.reg.Get(datastore.PoolKey{Namespace: ns, Name: "elsewhere"}); ok {
			t.Fatal("a pool of another shard is served")
		}
		updatePool(t, key, func(p *v1.InferencePool) { p.Labels = map[string]string{"shard": "b"} })
		r.waitGone(t, key)
		r.waitFor(t, "no pod watch running", func() bool { return r.metric("poolpicker_pod_watches") == 0 })
		updatePool(t, key, func(p *v1.InferencePool) { p.Labels = map[string]string{"shard": "a"} })
		r.waitEndpoints(t, key, "10.9.0.1:8000")
	})
}

func TestManyPoolsAtOnce(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		const pools = 200
		ns := env.Namespace(t, "many")
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range pools {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				sel := map[string]string{"pool": fmt.Sprintf("p%d", i)}
				createPod(t, ns, fmt.Sprintf("pod-%d", i), sel, ready(fmt.Sprintf("10.10.%d.%d", i/200, i%200+1)))
				createPool(t, ns, fmt.Sprintf("pool-%d", i), sel, []int32{8000})
			})
		}
		wg.Wait()
		r.waitFor(t, "all pools synced with their pod", func() bool {
			if r.reg.Len() != pools || !r.reg.AllSynced() {
				return false
			}
			for _, p := range r.reg.Pools() {
				if p.Endpoints().Len() != 1 {
					return false
				}
			}
			return true
		})
		for i := range pools {
			key := datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}
			want := []string{fmt.Sprintf("10.10.%d.%d:8000", i/200, i%200+1)}
			if got := r.endpoints(key); !slices.Equal(got, want) {
				t.Fatalf("%s endpoints %v, want %v", key, got, want)
			}
		}
		if got := r.metric("poolpicker_served_pools"); got != pools {
			t.Errorf("served pools metric = %v", got)
		}
	})
}
