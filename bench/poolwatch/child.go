// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/bench/internal/proc"
	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

func runChild(f benchFlags) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	var reqs testenv.RequestLog
	cfg = reqs.Wrap(cfg)
	reg := datastore.NewRegistry()
	wantEndpoints := f.pools * f.pods

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	t0 := time.Now()
	switch f.child {
	case "perpool", "namespace", "auto":
		opts := controllers.Options{Registry: reg, DisableStreamingLists: f.plainList,
			PodWatchPlan: map[string]podsource.Plan{"namespace": podsource.PlanNamespace, "auto": podsource.PlanAuto}[f.child]}
		if opts.PodWatchPlan == "" {
			opts.PodWatchPlan = podsource.PlanPerPool
		}
		if f.perNamespace {
			opts.Namespaces = namespaces(f)
		}
		if f.logV >= 0 {
			opts.Logger = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, time.Now().Format("15:04:05.000"), prefix, args) },
				funcr.Options{Verbosity: f.logV})
		}
		mopts, err := controllers.ManagerOptions(opts)
		if err != nil {
			return err
		}
		mgr, err := manager.New(cfg, mopts)
		if err != nil {
			return err
		}
		parts, err := controllers.Setup(mgr, opts)
		if err != nil {
			return err
		}
		for _, r := range parts.Runnables() {
			if err := mgr.Add(r); err != nil {
				return err
			}
		}
		go func() {
			err := mgr.Start(ctx)
			parts.Sources.Stop()
			done <- err
		}()
	case "baseline", "baseline-stripped":
		if err := startBaseline(ctx, cfg, f, reg, f.child == "baseline-stripped", done); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown mode %q", f.child)
	}

	// A harness has no event for "all pools synced": poll the registry.
	for reg.Len() != f.pools || !reg.AllSynced() || endpoints(reg) != wantEndpoints {
		select {
		case err := <-done:
			return errors.Join(errors.New("stopped before syncing"), err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Since(t0) > 10*time.Minute {
			return fmt.Errorf("not synced after 10m: %d pools, %d endpoints", reg.Len(), endpoints(reg))
		}
	}
	r := result{Mode: f.child, SyncSeconds: time.Since(t0).Seconds(), Pools: reg.Len(), Endpoints: endpoints(reg)}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	r.CPUSeconds = tv(ru.Utime) + tv(ru.Stime)
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapInuseBytes, r.HeapObjects = ms.HeapInuse, ms.HeapObjects
	r.RSSBytes, r.PeakRSSBytes = proc.StatusField(os.Getpid(), "VmRSS"), proc.StatusField(os.Getpid(), "VmHWM")
	r.Goroutines = runtime.NumGoroutine()
	if f.heapProfile != "" {
		if hf, err := os.Create(f.heapProfile + "." + f.child); err == nil {
			_ = pprof.WriteHeapProfile(hf)
			hf.Close()
		}
	}
	if f.logV >= 5 {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}

	scoped := regexp.MustCompile(`^/api/v1/namespaces/[^/]+/pods$`)
	if f.logV >= 4 {
		fmt.Fprintln(os.Stderr, "sync took", time.Since(t0))
	}
	r.ScopedPodReqs = true
	for _, q := range reqs.Requests() {
		if f.logV >= 4 {
			fmt.Fprintln(os.Stderr, q.At.Sub(t0).Round(time.Millisecond), q.Status, q.Method, q.URL.String())
		}
		r.Requests++
		if !strings.Contains(q.URL.Path, "/pods") {
			continue
		}
		r.PodRequests++
		if q.IsWatch() {
			r.PodWatches++
		}
		if !scoped.MatchString(q.URL.Path) || q.URL.Query().Get("labelSelector") == "" {
			r.ScopedPodReqs = false
		}
	}
	r.ResponseBytes = reqs.ResponseBytes()

	t1 := time.Now()
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stop: %w", err)
	}
	r.StopSeconds = time.Since(t1).Seconds()
	return json.NewEncoder(os.Stdout).Encode(r)
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

func endpoints(reg *datastore.Registry) int {
	n := 0
	for _, p := range reg.Pools() {
		n += p.Endpoints().Len()
	}
	return n
}

// startBaseline is the design poolpicker replaces: one informer over every
// pod of the namespaces, each event matched against the pools' selectors on
// the client, each pool's pods listed from that cache.
func startBaseline(ctx context.Context, cfg *rest.Config, f benchFlags, reg *datastore.Registry, stripped bool, done chan<- error) error {
	scheme := controllers.Scheme()
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	type poolInfo struct {
		key datastore.PoolKey
		sel labels.Selector
	}
	byNS := map[string][]poolInfo{}
	var pools v1.InferencePoolList
	for _, ns := range namespaces(f) {
		var l v1.InferencePoolList
		if err := direct.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return err
		}
		pools.Items = append(pools.Items, l.Items...)
	}
	for _, p := range pools.Items {
		set := labels.Set{}
		for k, v := range p.Spec.Selector.MatchLabels {
			set[string(k)] = string(v)
		}
		byNS[p.Namespace] = append(byNS[p.Namespace], poolInfo{key: datastore.PoolKey{Namespace: p.Namespace, Name: p.Name}, sel: labels.SelectorFromSet(set)})
	}
	opts := cache.Options{Scheme: scheme}
	if f.perNamespace {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces(f) {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if stripped {
		opts.ByObject = map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: stripPod}}
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	matched := 0
	match := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		for _, p := range byNS[pod.Namespace] {
			if p.sel.Matches(labels.Set(pod.Labels)) {
				matched++
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: match, UpdateFunc: func(_, o any) { match(o) }, DeleteFunc: match}); err != nil {
		return err
	}
	go func() { done <- c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("baseline cache did not sync")
	}
	for ns, ps := range byNS {
		for _, p := range ps {
			var list corev1.PodList
			if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: p.sel}); err != nil {
				return err
			}
			var srcs []datastore.EndpointSource
			for i := range list.Items {
				pod := &list.Items[i]
				if pod.DeletionTimestamp == nil && pod.Status.PodIP != "" && ready(pod) {
					srcs = append(srcs, datastore.EndpointSource{Pod: datastore.PoolKey{Namespace: ns, Name: pod.Name}, UID: pod.UID, IP: pod.Status.PodIP, Labels: pod.Labels})
				}
			}
			dp := reg.Upsert(p.key, &datastore.PoolSpec{Selector: map[string]string{}, TargetPorts: []int32{8000}})
			dp.SetPods(srcs)
			dp.SetSynced(true)
		}
	}
	return nil
}

func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// stripPod is poolpicker's pod transform, for the baseline-stripped mode.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Labels: pod.Labels, DeletionTimestamp: pod.DeletionTimestamp}}
	out.Status.PodIP = pod.Status.PodIP
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: c.Status}}
		}
	}
	return out, nil
}
