// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/bench/internal/benchpod"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

func startControlPlane() (*testenv.Env, error) {
	return testenv.Start(testenv.Options{})
}

func writeKubeconfig(env *testenv.Env, path string) error {
	return testenv.WriteKubeconfig(env.Config, path)
}

func podIP(n int) string { return fmt.Sprintf("10.%d.%d.%d", (n>>16)&255, (n>>8)&255, n&255) }

// populate creates the namespaces, pods (pool pods made Ready with an IP)
// and pools, with a pool of workers.
func populate(env *testenv.Env, f benchFlags) error {
	ctx := context.Background()
	nss := namespaces(f)
	for _, ns := range nss {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	type job func() error
	jobs := make(chan job)
	var firstErr atomic.Value
	var done atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for j := range jobs {
				if err := j(); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				done.Add(1)
			}
		})
	}
	for i := range f.pools {
		ns := nss[i%len(nss)]
		for j := range f.pods {
			n := i*f.pods + j + 1
			jobs <- func() error {
				pod := benchpod.ModelServer(ns, fmt.Sprintf("p%d-%d", i, j), map[string]string{"pool": fmt.Sprintf("p%d", i), "app": "vllm"}, 8000)
				if err := env.Client.Create(ctx, pod); err != nil {
					return err
				}
				benchpod.SetReady(pod, podIP(n))
				return env.Client.Status().Update(ctx, pod)
			}
		}
	}
	for k := range f.unrelated {
		ns := nss[k%len(nss)]
		jobs <- func() error {
			return env.Client.Create(ctx, benchpod.ModelServer(ns, fmt.Sprintf("u%d", k), map[string]string{"app": "unrelated", "batch": fmt.Sprintf("u%d", k%100)}, 8000))
		}
	}
	for i := range f.pools {
		ns := nss[i%len(nss)]
		jobs <- func() error {
			pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}}
			pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"pool": v1.LabelValue(fmt.Sprintf("p%d", i))}
			pool.Spec.TargetPorts = []v1.Port{{Number: 8000}}
			pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
			return env.Client.Create(ctx, pool)
		}
	}
	close(jobs)
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok && err != nil {
		return err
	}
	// A fresh API server builds a CRD's watch cache on the first request
	// to it and answers 429 until it is ready; a cluster's is long warm.
	// Touch the kinds the picker watches so the measured runs do not pay
	// for that.
	if err := env.Client.List(ctx, &v1alpha2.InferenceObjectiveList{}); err != nil {
		return err
	}
	if err := env.Client.List(ctx, &v1alpha2.InferenceModelRewriteList{}); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // no event tells when a watch cache is ready
	return nil
}
