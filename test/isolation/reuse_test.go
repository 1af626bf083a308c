// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// reusedIP is the address a pod of tenant A holds, then, after A's watch
// failed, a pod of tenant B.
const reusedIP = "127.0.123.2"

// extraB are servers of tenant B outside its Deployment (by IP), which
// tenant B's requests may be served by.
var extraB sync.Map

// reuse is what ipReused set up and saw.
var reuse struct {
	server *modelCounter
	// aServed and aFailed are tenant A's requests after B took the
	// address, by the endpoint that served them.
	mu      sync.Mutex
	aServed map[string]int
	aFailed int
}

// ipReused: a pod of tenant A holds reusedIP:8000; A's pod watch then
// fails (the picker's permission to list A's pods is taken back and its
// connections to the API server cut, as a network blip does); A's pod is
// deleted and a pod of tenant B takes the address, its server now B's. A's
// pool keeps its other endpoints (--stale-endpoints-timeout) while A sends
// requests; not one may reach B's server.
func ipReused(t *testing.T) (func(), <-chan struct{}) {
	ctx := context.Background()
	srv := startModelCounter(t, net.JoinHostPort(reusedIP, "8000"))
	reuse.server = srv
	reuse.aServed, reuse.aFailed = map[string]int{}, 0
	aMatch := map[string]string{"namespace": poolA.ns, "name": poolA.name}
	before := metricSum(t, "inference_pool_ready_pods", aMatch)
	aPod := types.NamespacedName{Namespace: poolA.ns, Name: "a-reused"}
	created := readyPod(t, aPod, reusedIP, map[string]string{"app": poolA.deploy.Name})
	poll.Until(t, time.Minute, "tenant A's pod at "+reusedIP+" an endpoint of A on every replica", func() bool {
		return metricSum(t, "inference_pool_ready_pods", aMatch) >= before+pickerReplicas
	})

	// A's watch fails: its namespace no longer grants the picker its pods,
	// and every watch is cut, so A's cannot resume while B's does.
	if err := stack.Client().Delete(ctx, podsBinding(poolA.ns)); err != nil {
		t.Fatal(err)
	}
	apiProxy.Cut()
	poll.Until(t, time.Minute, "tenant A's pod watch failing on every replica", func() bool {
		return metricSum(t, "poolpicker_pool_sync_failing", aMatch) >= pickerReplicas
	})
	if err := stack.Client().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: aPod.Namespace, Name: aPod.Name}}); err != nil {
		t.Fatal(err)
	}
	// Creation times have a resolution of a second, and the newer pod
	// holds an address: B's is created in a later second than A's, as in
	// a cluster, where an IP is reused after a grace period.
	time.Sleep(time.Until(created.Add(time.Second)))
	removeB := bPodAtReusedIP(t)
	poll.Until(t, time.Minute, "the address held by B's pod out of A's endpoints on every replica", func() bool {
		return metricSum(t, "poolpicker_pool_addresses_held_elsewhere", aMatch) >= pickerReplicas
	})
	srv.reset()

	stopA, settled := sendAsA("tenant A after its watch failed", func(o outcome) {
		reuse.mu.Lock()
		defer reuse.mu.Unlock()
		if o.ok() {
			reuse.aServed[o.endpoint]++
		} else {
			reuse.aFailed++
		}
	})
	return func() {
		stopA()
		removeB()
		srv.close()
		if err := stack.Client().Create(ctx, podsBinding(poolA.ns)); err != nil {
			t.Errorf("granting the picker tenant A's pods again: %v", err)
		}
		poll.Until(t, 2*time.Minute, "tenant A's pod watch recovered on every replica", func() bool {
			return metricSum(t, "poolpicker_pool_sync_failing", aMatch) == 0
		})
	}, settled
}

// aSteadyTraffic is ipReused without the misbehaviour, its reference in
// the full mode: the same requests of tenant A, its watch working, while
// a pod of tenant B holds reusedIP (never A's).
func aSteadyTraffic(t *testing.T) (func(), <-chan struct{}) {
	srv := startModelCounter(t, net.JoinHostPort(reusedIP, "8000"))
	removeB := bPodAtReusedIP(t)
	poll.Until(t, time.Minute, "tenant B's pod at "+reusedIP+" an endpoint of B on every replica", func() bool {
		return metricSum(t, "inference_pool_ready_pods", map[string]string{"namespace": poolB.ns, "name": poolB.name}) >= bPodsAtStart+pickerReplicas
	})
	stopA, settled := sendAsA("tenant A, its watch working", func(outcome) {})
	return func() {
		stopA()
		removeB()
		srv.close()
	}, settled
}

// bPodsAtStart is tenant B's ready pods, summed over the replicas, before
// bPodAtReusedIP adds one.
var bPodsAtStart float64

// bPodAtReusedIP creates a ready pod of tenant B's Deployment's labels at
// reusedIP (whose server the caller runs); remove deletes it and returns
// once no replica routes B's requests to it.
func bPodAtReusedIP(t *testing.T) (remove func()) {
	bMatch := map[string]string{"namespace": poolB.ns, "name": poolB.name}
	bPodsAtStart = metricSum(t, "inference_pool_ready_pods", bMatch)
	extraB.Store(reusedIP, true)
	readyPod(t, types.NamespacedName{Namespace: poolB.ns, Name: "b-reused"}, reusedIP, map[string]string{"app": poolB.deploy.Name})
	return func() {
		if err := stack.Client().Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: poolB.ns, Name: "b-reused"}}); err != nil {
			t.Errorf("deleting tenant B's pod at %s: %v", reusedIP, err)
		}
		poll.Until(t, time.Minute, "tenant B's pod at "+reusedIP+" gone from B's endpoints on every replica", func() bool {
			return metricSum(t, "inference_pool_ready_pods", bMatch) <= bPodsAtStart
		})
		extraB.Delete(reusedIP)
	}
}

// sendAsA sends tenant A's requests one after another until stopped, each
// outcome to seen; settled closes after the first 100 (the full mode: 1,000).
func sendAsA(prompt string, seen func(outcome)) (stop func(), settled <-chan struct{}) {
	want := 100
	if *full {
		want = 1000
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			seen(send(context.Background(), poolA.host, poolA.model, fmt.Sprintf("%s, request %d", prompt, i)))
			if i+1 == want {
				close(done)
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}, done
}

// aNeverOnReusedAddress checks that none of tenant A's requests after B
// took the address reached it, and that A was served meanwhile (by its
// other servers, kept for --stale-endpoints-timeout), so that the window
// tested something.
func aNeverOnReusedAddress(t *testing.T, _ window) {
	reuse.mu.Lock()
	defer reuse.mu.Unlock()
	served := 0
	for ep, n := range reuse.aServed {
		served += n
		if strings.HasPrefix(ep, reusedIP+":") {
			t.Errorf("%d of tenant A's requests were served at %s, which tenant B's pod holds", n, ep)
		}
	}
	if n := reuse.server.count(poolA.model); n > 0 {
		t.Errorf("tenant B's server at %s received %d requests for tenant A's model %s", reusedIP, n, poolA.model)
	}
	if served == 0 {
		t.Errorf("none of tenant A's requests was served (%d failed) while its pool kept its other endpoints", reuse.aFailed)
	}
	t.Logf("tenant A's requests after its watch failed: %d served by %v, %d refused; tenant B's server at %s got %d of B's", served, reuse.aServed, reuse.aFailed, reusedIP, reuse.server.count(poolB.model))
}

// modelCounter is a model server on loopback that answers completions at
// once and counts them by the model they name, and serves an idle vLLM
// metrics page.
type modelCounter struct {
	srv *http.Server
	mu  sync.Mutex
	by  map[string]int
}

func startModelCounter(t *testing.T, addr string) *modelCounter {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	page, err := vllmpage.Page(vllmpage.State{}, vllmpage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &modelCounter{by: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) })
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		m.mu.Lock()
		m.by[req.Model]++
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "cmpl-1", "object": "text_completion", "model": req.Model,
			"choices": []map[string]any{{"index": 0, "text": "x", "finish_reason": "length"}},
			"usage":   map[string]int{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	go m.srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { m.srv.Close() })
	return m
}

func (m *modelCounter) close() { m.srv.Close() }

func (m *modelCounter) reset() {
	m.mu.Lock()
	clear(m.by)
	m.mu.Unlock()
}

func (m *modelCounter) count(model string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.by[model]
}
