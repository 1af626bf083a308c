// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/internal/poll"
)

// hostileServers runs two hostile model servers in tenant A's pool: Ready
// pods of A's Deployment's labels whose IPs answer /metrics with serve.
func hostileServers(serve func(ctx context.Context, c net.Conn)) action {
	return func(t *testing.T) (func(), <-chan struct{}) {
		aPool := map[string]string{"namespace": poolA.ns, "name": poolA.name}
		errorsBefore := metricSum(t, "inference_pool_metrics_scrape_errors_total", aPool)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var stops []func()
		// The window lasts until the picker has come back to each hostile
		// server at least once: it spans a whole hostile scrape, however
		// long the picker lets one take.
		var asked sync.WaitGroup
		for i := range 2 {
			asks := 2
			var askMu sync.Mutex
			asked.Add(1)
			counted := func() {
				askMu.Lock()
				defer askMu.Unlock()
				if asks--; asks == 0 {
					asked.Done()
				}
			}
			ip := fmt.Sprintf("127.0.122.%d", 2+i)
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, "8000"))
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer c.Close()
						stop := context.AfterFunc(ctx, func() { c.Close() })
						defer stop()
						serve(ctx, &askCounter{Conn: c, counted: counted})
					}()
				}
			}()
			name := types.NamespacedName{Namespace: poolA.ns, Name: fmt.Sprintf("a-hostile-%d", i)}
			readyPod(t, name, ip, map[string]string{"app": poolA.deploy.Name})
			stops = append(stops, func() {
				if err := stack.Client().Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}); err != nil {
					t.Errorf("deleting %s: %v", name, err)
				}
				ln.Close()
			})
		}
		// The hostile servers are in effect once the picker has scraped them.
		poll.Until(t, time.Minute, "the hostile servers scraped", func() bool {
			return metricSum(t, "inference_pool_metrics_scrape_errors_total", aPool) > errorsBefore
		})
		settled := make(chan struct{})
		go func() {
			asked.Wait()
			close(settled)
		}()
		return func() {
			for _, s := range stops {
				s()
			}
			cancel()
			wg.Wait()
		}, settled
	}
}

// askCounter counts the requests a hostile server reads: each read that
// starts with a GET is one.
type askCounter struct {
	net.Conn
	counted func()
}

func (a *askCounter) Read(p []byte) (int, error) {
	n, err := a.Conn.Read(p)
	if bytes.HasPrefix(p[:n], []byte("GET ")) {
		a.counted()
	}
	return n, err
}

// readyPod creates a Running, Ready pod with the given IP, as a kubelet
// would report it, and returns its creation time.
func readyPod(t *testing.T, name types.NamespacedName, ip string, labels map[string]string) time.Time {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:latest"}}},
	}
	if err := stack.Client().Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: "127.0.0.1",
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if err := stack.Client().Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod.CreationTimestamp.Time
}

// readRequest reads one request head; false when the connection ended.
func readRequest(r *bufio.Reader) bool {
	req, err := http.ReadRequest(r)
	if err != nil {
		return false
	}
	req.Body.Close()
	return true
}

// endlessTrailers answers with a chunked page whose last chunk is followed
// by trailer lines without end, the socket kept full.
func endlessTrailers(ctx context.Context, c net.Conn) {
	if !readRequest(bufio.NewReader(c)) {
		return
	}
	if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")); err != nil {
		return
	}
	line := []byte("X-a: " + strings.Repeat("a", 4000) + "\r\n")
	for ctx.Err() == nil {
		if _, err := c.Write(line); err != nil {
			return
		}
	}
}

// manySeries answers every scrape with 30,000 distinct series of a family
// the scheduler reads (about 1.2 MB, under the page cap).
func manySeries(ctx context.Context, c net.Conn) {
	var page bytes.Buffer
	page.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for i := range 30_000 {
		fmt.Fprintf(&page, "vllm:num_requests_running{a=\"%d\"} 0\n", i)
	}
	r := bufio.NewReader(c)
	for ctx.Err() == nil && readRequest(r) {
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n", page.Len()); err != nil {
			return
		}
		if _, err := c.Write(page.Bytes()); err != nil {
			return
		}
	}
}

// slowEndlessPage answers with a chunked page that never ends: a chunk of
// series every 10 ms, slow and, given time, huge.
func slowEndlessPage(ctx context.Context, c net.Conn) {
	if !readRequest(bufio.NewReader(c)) {
		return
	}
	if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nTransfer-Encoding: chunked\r\n\r\n")); err != nil {
		return
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		var chunk bytes.Buffer
		for j := range 200 {
			fmt.Fprintf(&chunk, "vllm:num_requests_waiting{n=\"%d\"} 0\n", i*200+j)
		}
		if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", chunk.Len(), chunk.Bytes()); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// heldStreams are ext_proc streams tenant A opens straight to the
// replicas, as a gateway would for its pool, and leaves unfinished.
type heldStreams struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (h *heldStreams) stop() {
	h.cancel()
	h.wg.Wait()
}

// open opens n streams per replica for tenant A's pool and sends each
// msgs; every stream then reads its answers until it ends.
func openHeld(t *testing.T, n int, msgs ...*extprocv3.ProcessingRequest) *heldStreams {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldStreams{cancel: cancel}
	for _, r := range stack.Replicas() {
		c := conn(t, r.IP, poolA.authority())
		for range n {
			s, err := extprocv3.NewExternalProcessorClient(c).Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				for _, m := range msgs {
					if s.Send(m) != nil {
						break // refused; Recv says how
					}
				}
				for {
					if _, err := s.Recv(); err != nil {
						return
					}
				}
			}()
		}
	}
	return h
}

func requestHeaders() *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: ":authority", RawValue: []byte(poolA.host)}, {Key: "content-type", RawValue: []byte("application/json")},
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
	}
}

// stalledBodies: per replica, 100 streams of tenant A each send 512 KiB of
// body and never end it, half again the held-body budget.
func stalledBodies(t *testing.T) (func(), <-chan struct{}) {
	const part = 512 << 10
	chunk := append([]byte(`{"model":"tenant-a/base","prompt":"`), bytes.Repeat([]byte("a"), part)...)
	before := fairShareRejections(t, "held_request_body_bytes")
	h := openHeld(t, 100, requestHeaders(), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk}}})
	poll.Until(t, 2*time.Minute, "tenant A's bodies refused past its share", func() bool {
		return fairShareRejections(t, "held_request_body_bytes") > before
	})
	return h.stop, nil
}

// streamFlood: per replica, 1.5 times --max-concurrent-streams header-only
// streams of tenant A, never continued.
func streamFlood(t *testing.T) (func(), <-chan struct{}) {
	before := fairShareRejections(t, "concurrent_streams")
	h := openHeld(t, maxStreams*3/2, requestHeaders())
	poll.Until(t, 2*time.Minute, "tenant A's streams refused past its share", func() bool {
		return fairShareRejections(t, "concurrent_streams") > before
	})
	return h.stop, nil
}

// fairShareRejections counts tenant A's requests refused past its share of
// a limit, over the replicas.
func fairShareRejections(t *testing.T, limit string) float64 {
	t.Helper()
	return metricSum(t, "poolpicker_fair_share_rejections_total", map[string]string{"limit": limit, "namespace": poolA.ns})
}

// refusedPastShare checks, after the window, that tenant A was the one
// refused: its rejections past its share of limit grew (the case's start
// waited for the first), tenant B's did not.
func refusedPastShare(limit string) func(t *testing.T, w window) {
	return func(t *testing.T, w window) {
		if n := metricSum(t, "poolpicker_fair_share_rejections_total", map[string]string{"limit": limit, "namespace": poolB.ns}); n > 0 {
			t.Errorf("tenant B refused %v times past its share of %s", n, limit)
		}
	}
}

// inflatedCaches: two more servers of tenant A report 2^30 KV-cache
// blocks, and A sends them prompts that share nothing, each 16 KiB
// (256 blocks of the servers' 16 tokens).
func inflatedCaches(t *testing.T) (func(), <-chan struct{}) {
	return uniquePrompts(t, "a-inflated", 1<<30)
}

// uniquePromptsFloor: the same traffic of tenant A as inflatedCaches, to
// two more servers that report a true cache size (the simulator's): the
// inflated caches' reference in the full mode, since A's traffic costs
// tenant B on the suite's shared cores whatever caches A's servers report.
func uniquePromptsFloor(t *testing.T) (func(), <-chan struct{}) {
	return uniquePrompts(t, "a-unique", 0)
}

// uniquePrompts runs two more servers of tenant A in a Deployment of that
// name, reporting blocks KV-cache blocks (zero: the simulator's default),
// and sends A's pool prompts that share nothing, each 16 KiB.
func uniquePrompts(t *testing.T, name string, blocks int) (func(), <-chan struct{}) {
	ctx := context.Background()
	deploy := types.NamespacedName{Namespace: poolA.ns, Name: name}
	cache := ""
	if blocks > 0 {
		cache = fmt.Sprintf(`"--num-gpu-blocks=%d", `, blocks)
	}
	manifest := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: %s
  namespace: %s
spec:
  replicas: 2
  selector:
    matchLabels:
      app: %s
  template:
    metadata:
      labels:
        app: %s
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:latest
        args: ["--model=%s", "--port=8000", %s"--max-num-seqs=64", "--time-per-output-token=-1ns", "--prefill-time-per-token=-1ns", "--metrics-page-bytes=-1"]
`, deploy.Name, deploy.Namespace, poolA.deploy.Name, poolA.deploy.Name, poolA.model, cache)
	if stack.Deployment(deploy) == nil {
		if err := stack.Apply(ctx, []byte(manifest)); err != nil {
			t.Fatal(err)
		}
	} else if err := stack.Scale(ctx, deploy, 2); err != nil {
		t.Fatal(err)
	}
	// In the full mode each window of a pair, with the inflated caches or
	// without, sends these.
	prompts := 300
	if *full {
		prompts = 1000
	}
	sent := make(chan struct{})
	var mu sync.Mutex
	var refused []string
	go func() {
		defer close(sent)
		var wg sync.WaitGroup
		next := make(chan int)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					// A unique start makes every block of the prompt unique.
					p := fmt.Sprintf("%08d %s", i, strings.Repeat(fmt.Sprintf("unique prompt %d of tenant A. ", i), 16<<10/32))
					if o := send(ctx, poolA.host, poolA.model, p); !o.ok() {
						mu.Lock()
						refused = append(refused, o.String())
						mu.Unlock()
					}
				}
			}()
		}
		for i := range prompts {
			next <- i
		}
		close(next)
		wg.Wait()
	}()
	return func() {
		<-sent
		mu.Lock()
		t.Logf("tenant A's %d unique prompts: %d not served (its own to bear)", prompts, len(refused))
		mu.Unlock()
		if err := stack.Scale(ctx, deploy, 0); err != nil {
			t.Error(err)
		}
	}, sent
}

// bLateNames counts the windows of manyModelNames: each gives tenant B a
// name it has not used before (its servers serve lateAdapters of them).
var bLateNames int

const lateAdapters = 10

// manyModelNames: tenant A sends requests naming each of its 100 adapters,
// more names than the whole --max-model-labels, then tenant B's requests
// name a model B has not used before, which its share must admit.
func manyModelNames(t *testing.T) (func(), <-chan struct{}) {
	ctx := context.Background()
	for i := range adapters {
		if o := send(ctx, poolA.host, fmt.Sprintf("tenant-a/adapter-%03d", i), "a name of tenant A"); !o.ok() {
			t.Fatalf("tenant A's adapter %d: %v", i, o)
		}
	}
	bModel.Store(fmt.Sprintf("tenant-b/late-%d", bLateNames%lateAdapters))
	bLateNames++
	return func() { bModel.Store(poolB.model) }, nil
}

// bLabelKept checks that tenant A reached the label budget (some of its
// names counted as "other") and that tenant B's new model name got its own
// label value on every request of the window.
func bLabelKept(t *testing.T, w window) {
	if n := metricSum(t, "inference_objective_request_total", map[string]string{"namespace": poolA.ns, "model_name": "other"}); n == 0 {
		t.Errorf("none of tenant A's %d names counted as other: the case did not reach the budget of %d", adapters, maxModelLabels)
	}
	n := metricSum(t, "inference_objective_request_total", map[string]string{"namespace": poolB.ns, "model_name": w.bModelUsed})
	if int(n) < w.servedByB {
		t.Errorf("tenant B's %d requests for %s counted %v times under their own model_name label, after tenant A used %d names", w.servedByB, w.bModelUsed, n, adapters)
	}
}

// pendingPods is what largePendingPods created: how many bytes of pod
// objects, and the replicas' largest resident memory before.
var pendingPods struct {
	bytes     int64
	rssBefore int64
}

// largePendingPods: tenant A creates Pending pods (never scheduled, never
// ready) of no pool, which the namespace's pod watch sees, with 200 KiB of annotations each (the API server takes at most 256 KiB).
func largePendingPods(t *testing.T) (func(), <-chan struct{}) {
	ctx := context.Background()
	n := 150
	if *full {
		n = 400 // in each window with the pods
	}
	done := make(chan struct{})
	close(done)
	pendingPods.rssBefore = <-peakRSS(done)
	pendingPods.bytes = 0
	filler := strings.Repeat("p", 200<<10)
	var names []string
	for i := range n {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: poolA.ns, Name: fmt.Sprintf("a-pending-%d", i),
				Labels:      map[string]string{"app": "a-batch-job"},
				Annotations: map[string]string{"tenant-a.example/filler": filler}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:latest"}}},
		}
		if err := stack.Client().Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		names = append(names, pod.Name)
		pendingPods.bytes += int64(len(filler))
	}
	return func() {
		for _, name := range names {
			if err := stack.Client().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: poolA.ns, Name: name}}); err != nil {
				t.Errorf("deleting pod %s: %v", name, err)
			}
		}
	}, nil
}

// pendingPodsNotKept checks that the replicas did not keep the Pending
// pods' annotations: their memory grew by less than three eighths of the
// bytes created. A watch that kept them grew by about half of them; one
// that strips them by about a fifth (the decoding's garbage).
func pendingPodsNotKept(t *testing.T, w window) {
	if grown := w.peakRSS - pendingPods.rssBefore; grown > pendingPods.bytes*3/8 {
		t.Errorf("a replica's resident memory grew %d MiB while tenant A created %d MiB of Pending pods: the watch keeps what the picker does not read",
			grown>>20, pendingPods.bytes>>20)
	}
}
