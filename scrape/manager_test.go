// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"context"
	"crypto/tls"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

func TestScrapesEachEngine(t *testing.T) {
	servers := startModelServers(t, 3)
	h := newHarness(t, Options{})
	states := []vllmpage.State{
		{Waiting: 1, Running: 2, KVCacheUsage: 0.25, MaxLoRA: 2, RunningAdapters: []string{"a"}, BlockSize: 16, NumGPUBlocks: 100, ServedRequests: 10, PrefixCacheQueries: 5000, PrefixCacheHits: 4000},
		{Waiting: 3, Running: 4, KVCacheUsage: 0.5, BlockSize: 32, NumGPUBlocks: 200, ServedRequests: 20},
		{Waiting: 5, Running: 6, KVCacheUsage: 0.75, ServedRequests: 30},
	}
	servers[0].servePage(t, states[0], vllmpage.Options{Engine: vllmpage.VLLM})
	servers[1].servePage(t, states[1], vllmpage.Options{Engine: vllmpage.SGLang})
	servers[2].servePage(t, states[2], vllmpage.Options{Engine: vllmpage.TRTLLM})
	port := servers[0].port

	before := time.Now()
	vllmPool := h.addPool("vllm", nil, port, servers[0])
	sglangPool := h.addPool("sglang", map[string]string{AnnotationModelServerEngine: "sglang"}, port, servers[1])
	// The pod's label overrides its pool's engine.
	mixed := h.reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: "mixed"}, &datastore.PoolSpec{
		TargetPorts: []int32{int32(port)}, Annotations: map[string]string{AnnotationModelServerEngine: "sglang"},
	})
	mixed.SetPods(pods(map[string]string{LabelModelServerEngine: "trtllm"}, servers[2]))
	for _, s := range servers {
		h.awaitSuccess(t, s.addr)
	}

	tests := []struct {
		pool *datastore.Pool
		addr string
		want datastore.Metrics
	}{
		{vllmPool, servers[0].addr, datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.25, RunningAdapters: []string{"a"}, MaxAdapters: 2, BlockSize: 16, NumBlocks: 100, PrefixCacheQueries: 5000, PrefixCacheHits: 4000}},
		{sglangPool, servers[1].addr, datastore.Metrics{WaitingRequests: 3, RunningRequests: 4, KVCacheUsage: 0.5, BlockSize: 32, NumBlocks: 200}},
		{mixed, servers[2].addr, datastore.Metrics{WaitingRequests: 5, RunningRequests: 6, KVCacheUsage: 0.75}},
	}
	for _, tt := range tests {
		m := endpointOf(t, tt.pool, tt.addr).Metrics()
		if m.ScrapedAt.Before(before) || m.ScrapedAt.After(time.Now()) {
			t.Errorf("%s: ScrapedAt %v not during the test", tt.addr, m.ScrapedAt)
		}
		got := *m
		got.ScrapedAt = time.Time{}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %+v, want %+v", tt.addr, got, tt.want)
		}
	}
}

// Each failure keeps the last good snapshot, which goes stale, counts the
// error on the endpoint and the pool, and never stops the scraper: the
// endpoint recovers when its server does.
func TestScrapeFailures(t *testing.T) {
	const staleness = 300 * time.Millisecond
	huge := mustPage(t, vllmpage.State{}, vllmpage.Options{MinBytes: 1 << 20})
	good := mustPage(t, vllmpage.State{Waiting: 2, Running: 3, KVCacheUsage: 0.5}, vllmpage.Options{})
	tests := []struct {
		name     string
		reason   string
		wantText string
		// fail breaks the server (or the pool) of the endpoint.
		fail func(s *modelServer, h *harness, p *datastore.Pool)
		// unrecoverable cases do not check recovery.
		unrecoverable bool
	}{
		{name: "HTTP 500", reason: "status", wantText: "HTTP 500",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) {
				s.serve(http.StatusInternalServerError, []byte("engine dead"))
			}},
		{name: "malformed page", reason: "parse", wantText: "line 2",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) {
				s.serve(http.StatusOK, []byte("# HELP x\nvllm:num_requests_waiting{engine=\"0\" 1\n"))
			}},
		{name: "not a metrics page", reason: "parse", wantText: `"vllm:num_requests_waiting" missing`,
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) {
				s.serve(http.StatusOK, []byte("<html>welcome</html>\n"))
			}},
		{name: "truncated body", reason: "body", wantText: "unexpected EOF",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) {
				s.set(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Length", strconv.Itoa(len(good)))
					w.Write(good[:len(good)/2]) //nolint:errcheck
				})
			}},
		{name: "huge body with length", reason: "too_large", wantText: "exceeds the 262144-byte cap",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) { s.serve(http.StatusOK, huge) }},
		{name: "huge body streamed", reason: "too_large", wantText: "exceeds the 262144-byte cap",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) {
				s.set(func(w http.ResponseWriter, r *http.Request) {
					for i := 0; i < len(huge); i += 64 << 10 {
						if _, err := w.Write(huge[i:min(i+64<<10, len(huge))]); err != nil {
							return
						}
						w.(http.Flusher).Flush()
					}
				})
			}},
		{name: "slow server", reason: "timeout", wantText: "timed out",
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) { s.block() }},
		{name: "connection refused", reason: "connect", wantText: "connection refused", unrecoverable: true,
			fail: func(s *modelServer, _ *harness, _ *datastore.Pool) { s.srv.Close() }},
		{name: "bad pool annotation", reason: "config", wantText: `poolpicker.io/metrics-port="eighty"`,
			fail: func(_ *modelServer, h *harness, p *datastore.Pool) {
				spec := *p.Spec()
				spec.Annotations = map[string]string{AnnotationMetricsPort: "eighty"}
				h.reg.Upsert(p.Key, &spec)
			}},
		{name: "unknown engine label", reason: "config", wantText: `unknown model-server engine "tgi"`,
			fail: func(s *modelServer, _ *harness, p *datastore.Pool) {
				p.SetPods(pods(map[string]string{LabelModelServerEngine: "tgi"}, s))
			}},
		{name: "unknown upstream engine label", reason: "config", wantText: `label inference.networking.k8s.io/engine-type: unknown model-server engine "tgi"`,
			fail: func(s *modelServer, _ *harness, p *datastore.Pool) {
				p.SetPods(pods(map[string]string{LabelEngineType: "tgi"}, s))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startModelServers(t, 1)[0]
			s.serve(http.StatusOK, good)
			h := newHarness(t, Options{Timeout: 200 * time.Millisecond, StalenessThreshold: staleness, MaxBodyBytes: 256 << 10})
			p := h.addPool("pool", nil, s.port, s)
			h.awaitSuccess(t, s.addr)
			ep := endpointOf(t, p, s.addr)
			last := ep.Metrics()
			if got := h.series(t, "inference_pool_average_queue_size", "pool"); got[""] != 2 {
				t.Fatalf("queue aggregate while fresh %v, want 2", got)
			}

			tt.fail(s, h, p)
			ev := h.awaitError(t, s.addr, tt.reason)
			if !strings.Contains(ev.err.Error(), tt.wantText) {
				t.Errorf("error %q, want it to contain %q", ev.err, tt.wantText)
			}
			// The last good snapshot stays until it is stale, then the pool
			// aggregates leave it out. At least a second failure is awaited:
			// on a loaded machine the first can come after the staleness.
			for again := true; again || time.Since(last.ScrapedAt) <= staleness; again = false {
				h.awaitError(t, s.addr, tt.reason)
				if got := ep.Metrics(); got != last {
					t.Fatalf("a failed scrape replaced the snapshot: %+v", got)
				}
			}
			if ep.Metrics().Fresh(time.Now(), staleness) {
				t.Error("the last good snapshot is still fresh")
			}
			if got := h.series(t, "inference_pool_average_queue_size", "pool"); len(got) != 0 {
				t.Errorf("aggregate over stale endpoints exported: %v", got)
			}
			// The pool has this one endpoint: its series counts the
			// endpoint's errors.
			if n := h.series(t, "inference_pool_metrics_scrape_errors_total", "pool")[tt.reason]; n < 2 {
				t.Errorf("pool counts %v %s errors, want at least 2", n, tt.reason)
			}
			if tt.unrecoverable {
				return
			}
			// Recovery: the fix is a good server again (or a good spec/pod).
			s.serve(http.StatusOK, good)
			h.addPool("pool", nil, s.port, s)
			h.awaitSuccess(t, s.addr)
			if m := endpointOf(t, p, s.addr).Metrics(); !m.Fresh(time.Now(), staleness) || m.WaitingRequests != 2 {
				t.Errorf("after recovery: %+v", m)
			}
		})
	}
}

// A removed endpoint's scraper has exited when SetPods returns: its server
// sees no request after that, while the others go on being scraped.
func TestRemovedEndpointStopsScraping(t *testing.T) {
	servers := startModelServers(t, 3)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond})
	p := h.addPool("pool", nil, servers[0].port, servers...)
	for _, s := range servers {
		h.awaitSuccess(t, s.addr)
	}

	// Removal mid-request: the server holds a scrape when the pod leaves.
	arrived := servers[0].block()
	<-arrived
	p.SetPods(pods(nil, servers[1], servers[2]))
	afterFirst := servers[0].requests.Load()

	// Removal at any moment: the server's scrape has ended when SetPods
	// returns.
	h.m.mu.Lock()
	second := endpointOf(t, p, servers[1].addr)
	secondServer := h.m.pools[p.Key].subs[second.Key()].srv
	h.m.mu.Unlock()
	p.SetPods(pods(nil, servers[2]))
	h.m.mu.Lock()
	if secondServer.running || secondServer.index >= 0 || !secondServer.gone {
		t.Errorf("the removed endpoint's server still scraped after SetPods returned: running %v, queued %v", secondServer.running, secondServer.index >= 0)
	}
	h.m.mu.Unlock()
	afterSecond := servers[1].requests.Load()

	h.awaitScrapes(t, servers[2].addr, 10)
	if n := servers[0].requests.Load(); n != afterFirst {
		t.Errorf("endpoint removed mid-scrape got %d requests after removal", n-afterFirst)
	}
	// A request the scraper wrote just before it was stopped may still
	// reach the handler; nothing is sent after.
	if n := servers[1].requests.Load(); n > afterSecond+1 {
		t.Errorf("endpoint removed at any moment got %d requests after removal", n-afterSecond)
	}
	h.m.mu.Lock()
	left, scraped := len(h.m.pools[p.Key].subs), len(h.m.servers)
	h.m.mu.Unlock()
	if left != 1 || scraped != 1 {
		t.Errorf("%d endpoints and %d servers left, want 1 and 1", left, scraped)
	}
}

func TestRemovedPoolStopsScraping(t *testing.T) {
	servers := startModelServers(t, 3)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 4, KVCacheUsage: 0.5}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond})
	gone := h.addPool("gone", nil, servers[0].port, servers[0], servers[1])
	h.addPool("stays", nil, servers[0].port, servers[2])
	for _, s := range servers {
		h.awaitSuccess(t, s.addr)
	}
	if got := h.series(t, "inference_pool_average_kv_cache_utilization", "gone"); got[""] != 0.5 {
		t.Fatalf("kv aggregate %v, want 0.5", got)
	}
	// Both servers hold a scrape when the pool goes, so every request sent
	// before the removal has reached its handler.
	arrived := []<-chan struct{}{servers[0].block(), servers[1].block()}
	for _, a := range arrived {
		<-a
	}
	h.reg.Remove(gone.Key)
	counts := []int64{servers[0].requests.Load(), servers[1].requests.Load()}
	h.awaitScrapes(t, servers[2].addr, 10)
	for i, want := range counts {
		if n := servers[i].requests.Load(); n != want {
			t.Errorf("server %d of a removed pool got %d requests after removal", i, n-want)
		}
	}
	for _, family := range []string{"inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size", "inference_pool_average_running_requests", "inference_pool_metrics_scrapes_total"} {
		if got := h.series(t, family, "gone"); len(got) != 0 {
			t.Errorf("%s of the removed pool still exported: %v", family, got)
		}
		if got := h.series(t, family, "stays"); len(got) != 1 {
			t.Errorf("%s of the remaining pool: %v", family, got)
		}
	}
}

func TestPoolAggregates(t *testing.T) {
	servers := startModelServers(t, 2)
	servers[0].servePage(t, vllmpage.State{Waiting: 2, Running: 4, KVCacheUsage: 0.2}, vllmpage.Options{})
	servers[1].servePage(t, vllmpage.State{Waiting: 4, Running: 8, KVCacheUsage: 0.6}, vllmpage.Options{Engine: vllmpage.SGLang})
	const staleness = 200 * time.Millisecond
	h := newHarness(t, Options{StalenessThreshold: staleness})
	p := h.addPool("pool", nil, servers[0].port, servers...)
	// The second pod is SGLang by label.
	srcs := pods(nil, servers[0])
	srcs = append(srcs, pods(map[string]string{LabelModelServerEngine: "sglang"}, servers[1])...)
	p.SetPods(srcs)
	h.awaitSuccess(t, servers[0].addr)
	h.awaitSuccess(t, servers[1].addr)
	h.awaitSuccess(t, servers[1].addr)

	want := map[string]float64{
		"inference_pool_average_kv_cache_utilization": 0.4,
		"inference_pool_average_queue_size":           3,
		"inference_pool_average_running_requests":     6,
	}
	for family, v := range want {
		if got := h.series(t, family, "pool")[""]; math.Abs(got-v) > 1e-9 {
			t.Errorf("%s = %v, want %v", family, got, v)
		}
	}
	// Per model server, named POD-rank-I as upstream names them.
	perPod := map[string]float64{"pod-" + servers[0].ip + "-rank-0": 2, "pod-" + servers[1].ip + "-rank-0": 4}
	if got := h.series(t, "inference_pool_per_pod_queue_size", "pool"); !maps.Equal(got, perPod) {
		t.Errorf("inference_pool_per_pod_queue_size = %v, want %v", got, perPod)
	}
	// A failing endpoint drops out once stale.
	servers[1].serve(http.StatusServiceUnavailable, nil)
	last := endpointOf(t, p, servers[1].addr).Metrics()
	for time.Since(last.ScrapedAt) <= staleness {
		h.awaitError(t, servers[1].addr, "status")
	}
	if got := h.series(t, "inference_pool_average_queue_size", "pool")[""]; got != 2 {
		t.Errorf("queue aggregate with one stale endpoint %v, want 2", got)
	}
	delete(perPod, "pod-"+servers[1].ip+"-rank-0")
	if got := h.series(t, "inference_pool_per_pod_queue_size", "pool"); !maps.Equal(got, perPod) {
		t.Errorf("inference_pool_per_pod_queue_size with one stale endpoint = %v, want %v", got, perPod)
	}
}

// Path, port and scheme come from Options, overridden per pool by annotation.
func TestTargetAnnotations(t *testing.T) {
	page := mustPage(t, vllmpage.State{Waiting: 9, KVCacheUsage: 0.1}, vllmpage.Options{})
	s := startModelServers(t, 1)[0]
	s.set(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/custom/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write(page) //nolint:errcheck
	})
	// An https server on another loopback IP.
	tlsServer := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(page) })) //nolint:errcheck
	ln, err := net.Listen("tcp", "127.0.0.9:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsServer.Listener.Close()
	tlsServer.Listener = ln
	tlsServer.TLS = &tls.Config{}
	tlsServer.StartTLS()
	t.Cleanup(tlsServer.Close)
	tlsPort := ln.Addr().(*net.TCPAddr).Port

	h := newHarness(t, Options{})
	// Target port 1 serves nothing: the annotation's port is scraped.
	custom := h.addPool("custom", map[string]string{AnnotationMetricsPath: "/custom/metrics", AnnotationMetricsPort: strconv.Itoa(s.port)}, 1, s)
	plain := h.addPool("plain", nil, s.port, s)
	secure := h.reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: "secure"}, &datastore.PoolSpec{
		TargetPorts: []int32{int32(tlsPort)}, Annotations: map[string]string{AnnotationMetricsScheme: "https"},
	})
	secure.SetPods([]datastore.EndpointSource{{UID: "tls", IP: "127.0.0.9"}})

	customAddr := net.JoinHostPort(s.ip, "1")
	h.await(t, "good scrape of the annotated pool", func(ev scrapeEvent) bool { return ev.pool == custom.Key && ev.err == nil })
	if m := endpointOf(t, custom, customAddr).Metrics(); m == nil || m.WaitingRequests != 9 {
		t.Errorf("annotated pool metrics %+v", m)
	}
	ev := h.await(t, "plain pool's 404", func(ev scrapeEvent) bool { return ev.pool == plain.Key && ev.err != nil })
	if !strings.Contains(ev.err.Error(), "/metrics: HTTP 404") {
		t.Errorf("plain pool error %v", ev.err)
	}
	h.await(t, "https scrape", func(ev scrapeEvent) bool { return ev.pool == secure.Key && ev.err == nil })
}

func TestStartStop(t *testing.T) {
	s := startModelServers(t, 1)[0]
	s.servePage(t, vllmpage.State{Running: 1}, vllmpage.Options{})
	reg := datastore.NewRegistry()
	m, err := NewManager(Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(m)
	p := reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: "early"}, &datastore.PoolSpec{TargetPorts: []int32{int32(s.port)}})
	p.SetPods(pods(nil, s))
	if s.requests.Load() != 0 {
		t.Fatal("scraped before Start")
	}
	scraped := make(chan struct{}, 1)
	m.onScrape = func(datastore.PoolKey, string, error) {
		select {
		case scraped <- struct{}{}:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	<-scraped
	if err := m.Start(ctx); err == nil {
		t.Error("second Start succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start returned %v", err)
	}
	n := s.requests.Load()
	// Endpoints that come after the stop are never scraped.
	s2 := pods(nil, s)
	s2[0].UID = "other"
	p.SetPods(s2)
	if s.requests.Load() != n {
		t.Error("scraped after stop")
	}
	if m.Stats().Scrapes == 0 {
		t.Error("no scrapes counted")
	}
}
