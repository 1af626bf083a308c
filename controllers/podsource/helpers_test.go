// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

const waitTimeout = 60 * time.Second

// running is started Sources and what a test asserts on.
type running struct {
	s       *Sources
	reg     *datastore.Registry
	metrics *prometheus.Registry
	changes chan struct{}
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// changeObserver wakes waiters on every endpoint or pool change.
type changeObserver struct{ ch chan struct{} }

func (o changeObserver) poke() {
	select {
	case o.ch <- struct{}{}:
	default:
	}
}
func (o changeObserver) EndpointsChanged(*datastore.Pool, []*datastore.Endpoint, []*datastore.Endpoint) {
	o.poke()
}
func (o changeObserver) PoolRemoved(*datastore.Pool) { o.poke() }

// start runs Sources over cfg (env.Config when nil) until the test ends;
// the registry's other observers are added first.
func start(t *testing.T, cfg *rest.Config, opts Options, observers ...datastore.Observer) *running {
	t.Helper()
	if cfg == nil {
		cfg = env.Config
	}
	r := &running{reg: datastore.NewRegistry(), metrics: prometheus.NewRegistry(), changes: make(chan struct{}, 1), done: make(chan error, 1)}
	for _, o := range observers {
		r.reg.AddObserver(o)
	}
	r.reg.AddObserver(changeObserver{r.changes})
	opts.Registry = r.reg
	opts.Registerer = r.metrics
	opts.Logger = testr.New(t)
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- s.Start(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Sources.Start returned %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Sources.Start did not return after cancel")
	}
}

// serve serves the pool key, its pods selected by selector, on ports.
func (r *running) serve(t *testing.T, key datastore.PoolKey, selector map[string]string, ports ...int32) {
	t.Helper()
	r.s.Serve(ctx(t), key, &datastore.PoolSpec{Selector: selector, TargetPorts: ports})
}

// waitFor waits until cond holds. Endpoint and pool changes wake it at once;
// changes the datastore does not announce (a pool synced) are caught by a
// short poll.
func (r *running) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-r.changes:
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func addrs(s *datastore.EndpointSet) []string {
	out := make([]string, 0, s.Len())
	for _, e := range s.Endpoints {
		out = append(out, e.Address)
	}
	return out
}

// waitEndpoints waits until the pool is served, synced and has exactly want.
func (r *running) waitEndpoints(t *testing.T, key datastore.PoolKey, want ...string) {
	t.Helper()
	sort.Strings(want)
	if want == nil {
		want = []string{}
	}
	r.waitFor(t, fmt.Sprintf("%s endpoints %v", key, want), func() bool {
		p, ok := r.reg.Get(key)
		return ok && p.Synced() && slices.Equal(addrs(p.Endpoints()), want)
	})
}

func (r *running) waitGone(t *testing.T, key datastore.PoolKey) {
	t.Helper()
	r.waitFor(t, fmt.Sprintf("%s not served", key), func() bool {
		_, ok := r.reg.Get(key)
		return !ok
	})
}

// metric is the value of the named gauge or counter in the Sources'
// registry: the series labelled namespace and name when nsName holds them,
// the unlabelled one otherwise; 0 when there is no such series.
func (r *running) metric(name string, nsName ...string) float64 {
	var labels map[string]string
	if len(nsName) == 2 {
		labels = map[string]string{"namespace": nsName[0], "name": nsName[1]}
	}
	return promtest.Value(r.metrics, name, labels)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// podSpec looks like a model server's, so that what a watch carries is
// realistic in size.
func podSpec() corev1.PodSpec {
	return corev1.PodSpec{Containers: []corev1.Container{{
		Name:  "vllm",
		Image: "vllm/vllm-openai:v0.10.0",
		Args:  []string{"--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"},
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
	}}}
}

type podState struct {
	ip    string
	ready bool
}

var ready = func(ip string) podState { return podState{ip: ip, ready: true} }

// createPod creates a pod and gives it an IP and a Ready condition, as a
// kubelet would.
func createPod(t *testing.T, ns, name string, lbls map[string]string, st podState) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: maps.Clone(lbls)}, Spec: podSpec()}
	if err := env.Client.Create(ctx(t), pod); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	setPodStatus(t, pod, st.ip, st.ready)
	return pod
}

func setPodStatus(t *testing.T, pod *corev1.Pod, ip string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for {
		var cur corev1.Pod
		if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(pod), &cur); err != nil {
			t.Fatalf("get pod %s: %v", pod.Name, err)
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.PodIP = ip
		cur.Status.PodIPs = nil
		if ip != "" {
			cur.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		}
		cur.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: status},
		}
		err := env.Client.Status().Update(ctx(t), &cur)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			t.Fatalf("update pod status %s: %v", pod.Name, err)
		}
	}
}

func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := env.Client.Delete(ctx(t), pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatalf("delete pod %s/%s: %v", ns, name, err)
	}
}

// eachPlan runs test under each pod watch plan, as subtests named by it:
// every guarantee of the pod watches holds in both.
func eachPlan(t *testing.T, test func(t *testing.T, plan Plan)) {
	t.Helper()
	for _, plan := range []Plan{PlanPerPool, PlanNamespace} {
		t.Run(string(plan), func(t *testing.T) { test(t, plan) })
	}
}

// watchedSelector is the label selector the API server gets for a pool of
// selector under plan: none in the namespace plan.
func watchedSelector(plan Plan, selector string) string {
	if plan == PlanNamespace {
		return ""
	}
	return selector
}

// namespaceWatched reports whether the namespace plan is in force in ns.
func (s *Sources) namespaceWatched(ns string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plans[ns]
	return p != nil && p.namespaceWatch.Load()
}
