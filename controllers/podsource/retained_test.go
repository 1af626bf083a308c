// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/poolpicker/poolpicker/datastore"

	"github.com/poolpicker/poolpicker/controllers/podsource/internal/podwatch"
)

// retained is what a namespace's watch holds: its pods and their label
// bytes.
func (s *Sources) retained(ns string) (pods, labelBytes int) {
	s.mu.Lock()
	w := s.nsWatches[ns]
	s.mu.Unlock()
	if w == nil {
		return 0, 0
	}
	w.watch.EachPod(func(_ string, p *podwatch.Pod) {
		pods++
		for k, v := range p.Labels {
			labelBytes += len(k) + len(v)
		}
	})
	return pods, labelBytes
}

// A namespace watch keeps only the pods that are endpoints: Pending,
// unready and terminating pods (a deployment of large pods waiting for
// GPUs) are not held, whatever their labels weigh, and one that turns
// ready is kept from the update that says so. The test counts what the
// watch holds: on a build that keeps every pod it holds all of them.
func TestNamespaceWatchKeepsOnlyEndpoints(t *testing.T) {
	ns := env.Namespace(t, "pending")
	const pending = 60
	sel := map[string]string{"app": "m"}
	big := map[string]string{"app": "m"}
	for i := range 16 {
		big[fmt.Sprintf("team.example.com/label-%d", i)] = strings.Repeat("x", 60)
	}
	for i := range pending {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pending-%d", i), Labels: big}, Spec: podSpec()}
		if err := env.Client.Create(ctx(t), pod); err != nil {
			t.Fatal(err)
		}
	}
	unready := createPod(t, ns, "unready", big, podState{ip: "10.25.0.9"})
	createPod(t, ns, "m0", sel, ready("10.25.0.1"))

	r := start(t, nil, Options{Plan: PlanNamespace})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	r.serve(t, key, sel, 8000)
	r.waitEndpoints(t, key, "10.25.0.1:8000")
	pods, labelBytes := r.s.retained(ns)
	// What keeping them would cost, for the log.
	kept := (pending + 1) * (labelBytes/max(pods, 1) + 16*(len("team.example.com/label-10")+60))
	t.Logf("the namespace watch holds %d pods (%d label bytes) of %d; keeping the Pending and unready ones would add about %d label bytes",
		pods, labelBytes, pending+2, kept)
	if pods != 1 {
		t.Fatalf("the namespace watch holds %d pods, want only the 1 endpoint of %d", pods, pending+2)
	}

	setPodStatus(t, unready, "10.25.0.9", true)
	r.waitEndpoints(t, key, "10.25.0.1:8000", "10.25.0.9:8000")
	setPodStatus(t, unready, "10.25.0.9", false)
	r.waitEndpoints(t, key, "10.25.0.1:8000")
	if pods, _ := r.s.retained(ns); pods != 1 {
		t.Fatalf("the namespace watch holds %d pods after one turned unready again, want 1", pods)
	}
}
