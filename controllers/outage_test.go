// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// endpointCounts records the size of a pool's endpoint set at each change.
type endpointCounts struct {
	key datastore.PoolKey
	mu  sync.Mutex
	got []int
}

func (c *endpointCounts) EndpointsChanged(p *datastore.Pool, _, _ []*datastore.Endpoint) {
	if p.Key == c.key {
		c.mu.Lock()
		c.got = append(c.got, p.Endpoints().Len())
		c.mu.Unlock()
	}
}
func (c *endpointCounts) PoolRemoved(*datastore.Pool) {}

func (c *endpointCounts) counts() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.got...)
}

// TestLeaderStepsDownAcrossAnOutage freezes the API server, as SIGSTOP
// does, for a leader of a synced pool. It steps down once it cannot renew
// its Lease (writes pause) and goes on running with the pool's last
// endpoints while the Lease expires; when the API server comes back, it
// takes the Lease again, its watches catch up with what changed meanwhile
// (a new pod, a new pool) without the pool's endpoints ever going empty,
// and the writers resume (the new pool is claimed).
func TestLeaderStepsDownAcrossAnOutage(t *testing.T) {
	ns := env.Namespace(t, "outage")
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPod(t, ns, "m0", map[string]string{"app": "m"}, ready("10.18.0.1"))
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000})
	outage := env.OutageProxy(t)
	name := uniquePickerName("outage")
	opts := haOptions(name, ns, ns)
	opts.ProvisionPickerServices = false
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = 4*time.Second, 3*time.Second, 250*time.Millisecond
	counts := &endpointCounts{key: key}
	r := start(t, outage.Config, opts, counts)
	r.waitEndpoints(t, key, "10.18.0.1:8000")
	r.waitFor(t, "the Lease", r.parts.Leader.IsLeader)
	claim := ns + "/" + name
	waitClaim(t, r, key, claim)

	outage.Freeze()
	frozen := time.Now()
	r.waitFor(t, "the leader to step down", func() bool { return !r.parts.Leader.IsLeader() })
	stepDown := time.Since(frozen)
	if got := r.metric("poolpicker_leader"); got != 0 {
		t.Errorf("poolpicker_leader = %v after stepping down", got)
	}
	// What changes meanwhile reaches the API server, not the picker.
	createPod(t, ns, "m1", map[string]string{"app": "m"}, ready("10.18.0.2"))
	createPool(t, ns, "later", map[string]string{"app": "m"}, []int32{8000})
	r.waitFor(t, "the Lease to expire", func() bool {
		var l coordinationv1.Lease
		if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil || l.Spec.RenewTime == nil {
			return false
		}
		return time.Since(l.Spec.RenewTime.Time) > opts.LeaseDuration
	})
	select {
	case err := <-r.done:
		t.Fatalf("the manager returned during the outage: %v", err)
	default:
	}
	if got := r.endpoints(key); len(got) != 1 || got[0] != "10.18.0.1:8000" {
		t.Fatalf("endpoints during the outage %v, want the last list [10.18.0.1:8000]", got)
	}
	if p, _ := r.reg.Get(key); !p.Synced() {
		t.Fatal("the pool stopped being synced during the outage")
	}
	if r.parts.Leader.IsLeader() {
		t.Fatal("leader again while the API server is frozen")
	}
	outageLasted := time.Since(frozen)

	outage.Resume()
	resumed := time.Now()
	r.waitFor(t, "the Lease again", r.parts.Leader.IsLeader)
	reacquired := time.Since(resumed)
	r.waitEndpoints(t, key, "10.18.0.1:8000", "10.18.0.2:8000")
	waitClaim(t, r, datastore.PoolKey{Namespace: ns, Name: "later"}, claim)
	t.Logf("stepped down %v after the freeze (renew deadline %v), frozen %v, leader again %v after it ended",
		stepDown.Round(time.Millisecond), opts.RenewDeadline, outageLasted.Round(time.Millisecond), reacquired.Round(time.Millisecond))
	if stepDown > opts.LeaseDuration {
		t.Errorf("stepped down %v after the freeze, after its Lease (%v) had expired: another replica could have written meanwhile", stepDown, opts.LeaseDuration)
	}
	for i, n := range counts.counts() {
		if n == 0 {
			t.Errorf("the pool's endpoints went empty (change %d of %v)", i, counts.counts())
		}
	}
}

// waitClaim waits until the pool carries the claim.
func waitClaim(t *testing.T, r *running, key datastore.PoolKey, claim string) {
	t.Helper()
	r.waitFor(t, key.String()+" claimed by "+claim, func() bool {
		var p v1.InferencePool
		return env.Client.Get(ctx(t), key, &p) == nil && p.Annotations[ClaimAnnotation] == claim
	})
}
