// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/bench/internal/benchpod"
	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// Pod addresses are 127.100.b.c with b and c in 1..254: every pod its own
// address, as in a cluster, never .0 or .255, and clear of the 127.0.x.y
// addresses the tests bind.
const (
	addrBase     = 100
	maxAddresses = 254 * 254
)

// podAddr is the loopback address of pod n (0-based).
func podAddr(n int) net.IP {
	return net.IPv4(127, addrBase, byte(n/254+1), byte(n%254+1))
}

// podIndex inverts podAddr; ok is false for any other address.
func podIndex(ip net.IP) (int, bool) {
	ip4 := ip.To4()
	if ip4 == nil || ip4[0] != 127 || ip4[1] != addrBase || ip4[2] < 1 || ip4[2] > 254 || ip4[3] < 1 || ip4[3] > 254 {
		return 0, false
	}
	return int(ip4[2]-1)*254 + int(ip4[3]-1), true
}

func namespace(pool, namespaces int) string { return fmt.Sprintf("scale-%d", pool%namespaces) }
func poolName(pool int) string              { return fmt.Sprintf("pool-%d", pool) }
func podName(pool, j int) string            { return fmt.Sprintf("p%d-%d", pool, j) }

// snapshotDir is where a shape's populated etcd data directory is kept.
func snapshotDir(c config) string {
	return filepath.Join(c.snapshots, fmt.Sprintf("pools%d-pods%d-ns%d-port%d", c.Pools, c.Pods, c.Namespaces, c.Port))
}

// ensureSnapshot populates the shape's cluster once and keeps its etcd data
// directory; a directory without the completion marker is rebuilt.
func ensureSnapshot(ctx context.Context, c config, bin string) (string, time.Duration, error) {
	dir := snapshotDir(c)
	done := filepath.Join(dir, "populated")
	if _, err := os.Stat(done); err == nil {
		return dir, 0, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", 0, err
	}
	data := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return "", 0, err
	}
	env, err := testenv.Start(testenv.Options{EtcdDataDir: data})
	if err != nil {
		return "", 0, err
	}
	start := time.Now()
	err = populate(ctx, env, c)
	if err == nil {
		err = prime(ctx, env, c, bin)
	}
	took := time.Since(start)
	if stopErr := env.Stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return "", 0, fmt.Errorf("populating: %w", err)
	}
	return dir, took, os.WriteFile(done, []byte(took.String()+"\n"), 0o644)
}

// populate creates the namespaces, the pods (Ready, each with its loopback
// address) and the pools, with many writers and a high client QPS. The
// pools carry the label of the pools poolpicker's default deployment serves
// (its default --pool-selector) and its claim for its default deployment name, so a run
// is a picker restarting where it already serves them (the first start
// ever writes that claim once per pool).
func populate(ctx context.Context, env *testenv.Env, c config) error {
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 10_000, 10_000
	cl, err := client.New(&cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	for i := range c.Namespaces {
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace(i, c.Namespaces)}}); err != nil {
			return err
		}
	}
	jobs := make(chan func() error)
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for j := range jobs {
				if err := j(); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	send := func(j func() error) bool {
		select {
		case jobs <- j:
			return firstErr.Load() == nil
		case <-ctx.Done():
			return false
		}
	}
	claim := controllers.DefaultPickerNamespace + "/" + controllers.DefaultPickerName
feed:
	for i := range c.Pools {
		ns := namespace(i, c.Namespaces)
		for j := range c.Pods {
			n := i*c.Pods + j
			if !send(func() error {
				pod := benchpod.ModelServer(ns, podName(i, j), map[string]string{"pool": fmt.Sprintf("p%d", i), "app": "vllm"}, int32(c.Port))
				return retryTimeouts(ctx, func() error {
					if err := cl.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
						// A create that timed out may have been done.
						if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
							return err
						}
					} else if err != nil {
						return err
					}
					benchpod.SetReady(pod, podAddr(n).String())
					return cl.Status().Update(ctx, pod)
				})
			}) {
				break feed
			}
		}
		if !send(func() error {
			pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: poolName(i),
				Labels:      map[string]string{controllers.PickerLabel: controllers.DefaultPickerName},
				Annotations: map[string]string{controllers.ClaimAnnotation: claim}}}
			pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"pool": v1.LabelValue(fmt.Sprintf("p%d", i))}
			pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(c.Port)}}
			pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
			return retryTimeouts(ctx, func() error {
				if err := cl.Create(ctx, pool); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
				return nil
			})
		}) {
			break
		}
	}
	close(jobs)
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		return *err
	}
	return ctx.Err()
}

// retryTimeouts runs f again, up to five times, while the API server
// answers it with a timeout or throttling: a loaded machine's API server
// times out some of the populating writers' requests.
func retryTimeouts(ctx context.Context, f func() error) error {
	for attempt := 1; ; attempt++ {
		err := f()
		if attempt == 5 || !(apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil) {
			return err
		}
		if err := sleep(ctx, time.Duration(attempt)*time.Second); err != nil {
			return err
		}
	}
}

// awaitWatchCache retries a streaming list of kind until the API server
// answers it from its watch cache to the end of the initial events.
func awaitWatchCache(ctx context.Context, env *testenv.Env, kind client.ObjectList) error {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	send := true
	opts := &client.ListOptions{Raw: &metav1.ListOptions{SendInitialEvents: &send, AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		w, err := wc.Watch(ctx, kind, opts)
		if err == nil {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Bookmark {
					continue
				}
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					w.Stop()
					return nil
				}
			}
			w.Stop()
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("the API server's watch cache of %T is not ready after 2m", kind), err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// prime runs poolpicker once on the new cluster, with a high client QPS,
// until it has written what its first start writes (each pool's status),
// so that the measured runs are a picker restarting where it already
// serves the pools, as after an upgrade or a crash.
func prime(ctx context.Context, env *testenv.Env, c config, bin string) error {
	dir, err := os.MkdirTemp("", "scale-prime")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(env.Config, kubeconfig); err != nil {
		return err
	}
	pc := c
	pc.PickerArgs = "--kube-api-qps=5000 --kube-api-burst=5000"
	p, err := startPicker(ctx, bin, kubeconfig, pc)
	if err != nil {
		return err
	}
	defer p.stop()
	if _, err := p.waitReady(ctx, 15*time.Minute); err != nil {
		return err
	}
	// No event says the writers are done: wait for 5 s without a request.
	last, quiet := -1.0, time.Now()
	for time.Since(quiet) < 5*time.Second {
		m, err := p.readMetrics(ctx)
		if err != nil {
			return err
		}
		if m.requests != last {
			last, quiet = m.requests, time.Now()
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// startCluster starts etcd and kube-apiserver on a fresh copy of the
// shape's snapshot, warms the watch caches of the kinds poolpicker lists
// (a cluster's are long warm) and returns the control plane with a
// function that stops it and removes the copy.
func startCluster(ctx context.Context, snapshot string) (*testenv.Env, func(), error) {
	work, err := os.MkdirTemp("", "scale-etcd")
	if err != nil {
		return nil, nil, err
	}
	data := filepath.Join(work, "etcd")
	if out, err := exec.CommandContext(ctx, "cp", "-a", filepath.Join(snapshot, "etcd"), data).CombinedOutput(); err != nil {
		os.RemoveAll(work)
		return nil, nil, fmt.Errorf("copying the snapshot: %w: %s", err, out)
	}
	env, err := testenv.Start(testenv.Options{EtcdDataDir: data})
	if err != nil {
		os.RemoveAll(work)
		return nil, nil, err
	}
	stop := func() {
		_ = env.Stop()
		os.RemoveAll(work)
	}
	// A CRD's watch cache is built on the first request to it and answers
	// 429 until ready (a cluster's are long warm): wait until a streaming
	// list of each kind poolpicker watches ends its initial events.
	for _, l := range []client.ObjectList{&v1.InferencePoolList{}, &v1alpha2.InferenceObjectiveList{}, &v1alpha2.InferenceModelRewriteList{},
		&llmdv1alpha2.InferenceObjectiveList{}, &llmdv1alpha2.InferenceModelRewriteList{}, &corev1.PodList{}} {
		if err := awaitWatchCache(ctx, env, l); err != nil {
			stop()
			return nil, nil, err
		}
	}
	return env, stop, nil
}
