// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

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

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

const waitTimeout = 60 * time.Second

// running is a started manager with the reconcilers and parts of Setup,
// assembled as the process does, and what a test asserts on.
type running struct {
	parts   *Parts
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

// start runs the controllers over cfg (env.Config when nil) until the test
// ends; the registry's other observers are added first. opts.Logger, when
// unset, writes to the test log.
func start(t *testing.T, cfg *rest.Config, opts Options, observers ...datastore.Observer) *running {
	t.Helper()
	return startConfigured(t, cfg, opts, nil, observers...)
}

// startConfigured is start with configure applied to the parts before the
// manager starts.
func startConfigured(t *testing.T, cfg *rest.Config, opts Options, configure func(*Parts), observers ...datastore.Observer) *running {
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
	if opts.Logger.GetSink() == nil {
		opts.Logger = testLogger(t)
	}
	mgr, parts, err := assemble(cfg, opts)
	if err != nil {
		t.Fatalf("assembling the controllers: %v", err)
	}
	r.parts = parts
	if configure != nil {
		configure(parts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		err := mgr.Start(ctx)
		parts.Sources.Stop()
		r.done <- err
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// assemble makes a manager and adds the controllers to it as
// cmd/poolpicker/app does.
func assemble(cfg *rest.Config, opts Options) (manager.Manager, *Parts, error) {
	mopts, err := ManagerOptions(opts)
	if err != nil {
		return nil, nil, err
	}
	mgr, err := manager.New(cfg, mopts)
	if err != nil {
		return nil, nil, err
	}
	parts, err := Setup(mgr, opts)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range parts.Runnables() {
		if err := mgr.Add(r); err != nil {
			return nil, nil, err
		}
	}
	return mgr, parts, nil
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
			t.Errorf("the manager returned %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the manager did not return after cancel")
	}
}

// waitFor waits until cond holds. Endpoint and pool changes wake it at once;
// changes the datastore does not announce (a pool added, synced) are caught
// by a short poll.
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

// endpoints of the pool as sorted addresses; nil when not served.
func (r *running) endpoints(key datastore.PoolKey) []string {
	p, ok := r.reg.Get(key)
	if !ok {
		return nil
	}
	return addrs(p.Endpoints())
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

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

type poolOpt func(*v1.InferencePool)

func withPicker(name string, port int32) poolOpt {
	return func(p *v1.InferencePool) {
		p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: v1.ObjectName(name), Port: &v1.Port{Number: v1.PortNumber(port)}}
	}
}

func withLabels(l map[string]string) poolOpt {
	return func(p *v1.InferencePool) { p.Labels = l }
}

func newPool(ns, name string, selector map[string]string, ports []int32, opts ...poolOpt) *v1.InferencePool {
	p := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{}
	for k, v := range selector {
		p.Spec.Selector.MatchLabels[v1.LabelKey(k)] = v1.LabelValue(v)
	}
	for _, port := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, v1.Port{Number: v1.PortNumber(port)})
	}
	p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	for _, o := range opts {
		o(p)
	}
	return p
}

func createPool(t *testing.T, ns, name string, selector map[string]string, ports []int32, opts ...poolOpt) *v1.InferencePool {
	t.Helper()
	p := newPool(ns, name, selector, ports, opts...)
	if err := env.Client.Create(ctx(t), p); err != nil {
		t.Fatalf("create pool %s/%s: %v", ns, name, err)
	}
	return p
}

// updatePool applies mutate to the current pool, retrying on conflicts.
func updatePool(t *testing.T, key datastore.PoolKey, mutate func(*v1.InferencePool)) {
	t.Helper()
	for {
		var p v1.InferencePool
		if err := env.Client.Get(ctx(t), key, &p); err != nil {
			t.Fatalf("get pool %s: %v", key, err)
		}
		mutate(&p)
		err := env.Client.Update(ctx(t), &p)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			t.Fatalf("update pool %s: %v", key, err)
		}
	}
}

func deletePool(t *testing.T, key datastore.PoolKey) {
	t.Helper()
	p := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := env.Client.Delete(ctx(t), p); err != nil {
		t.Fatalf("delete pool %s: %v", key, err)
	}
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
	ip         string
	ready      bool
	finalizers []string
}

// createPod creates a pod and gives it an IP and a Ready condition, as a
// kubelet would.
func createPod(t *testing.T, ns, name string, lbls map[string]string, st podState) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: maps.Clone(lbls), Finalizers: st.finalizers}, Spec: podSpec()}
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

const testFinalizer = "poolpicker.io/test-hold"

func removeFinalizers(t *testing.T, ns, name string) {
	t.Helper()
	var pod corev1.Pod
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
		t.Fatalf("get pod: %v", err)
	}
	patch := client.MergeFrom(pod.DeepCopy())
	pod.Finalizers = nil
	if err := env.Client.Patch(ctx(t), &pod, patch); err != nil {
		t.Fatalf("remove finalizers of %s: %v", name, err)
	}
}

// testLogger writes the manager's logs to the test log.
func testLogger(t *testing.T) logr.Logger { return testr.New(t) }

func clientKey(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }

// eachPlan runs test under each pod watch plan, as subtests named by it:
// every guarantee of the pod watches holds in both.
// lastPlanEnded is when eachPlan's last subtest ended, in any test.
var lastPlanEnded time.Time

func eachPlan(t *testing.T, test func(t *testing.T, plan podsource.Plan)) {
	t.Helper()
	for _, plan := range []podsource.Plan{podsource.PlanPerPool, podsource.PlanNamespace} {
		// The plans' subtests create pods of the same IPs in namespaces of
		// their own, and the earlier ones stay (envtest deletes no
		// namespace). Of two pods claiming one IP the one created later
		// holds it, at the API server's one-second resolution: the next
		// plan's pods must be created in a later second than the last.
		time.Sleep(time.Until(lastPlanEnded.Truncate(time.Second).Add(time.Second)))
		t.Run(string(plan), func(t *testing.T) { test(t, plan) })
		lastPlanEnded = time.Now()
	}
}

// watchedSelector is the label selector the API server gets for a pool of
// selector under plan: none in the namespace plan.
func watchedSelector(plan podsource.Plan, selector string) string {
	if plan == podsource.PlanNamespace {
		return ""
	}
	return selector
}

// metricLabels name the labels of the values given to metric, in order.
var metricLabels = []string{"namespace", "name", "kind"}

// metric is the value of the named gauge or counter in the registry of
// r's parts: the series whose labels namespace, name and kind are the
// values given, as many as given (the unlabelled series when none); 0 when
// there is no such series.
func (r *running) metric(name string, values ...string) float64 {
	labels := make(map[string]string, len(values))
	for i, v := range values {
		labels[metricLabels[i]] = v
	}
	return promtest.Value(r.metrics, name, labels)
}

// series counts the series of the named metric in r's registry.
func (r *running) series(name string) int {
	mfs, err := r.metrics.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}
