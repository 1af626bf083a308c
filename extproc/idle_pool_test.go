// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scrape"
)

// heldMetricsServer is a model server's /metrics on a loopback IP of its
// own; once hold is closed, it reports each scrape's arrival and holds it
// until release is closed.
type heldMetricsServer struct {
	addr    string
	arrived chan struct{}
}

func startHeldMetricsServer(t *testing.T, ip string, port int, st vllmpage.State, hold, release <-chan struct{}) *heldMetricsServer {
	t.Helper()
	page, err := vllmpage.Page(st, vllmpage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	s := &heldMetricsServer{addr: ln.Addr().String(), arrived: make(chan struct{}, 100)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
			s.arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		default:
		}
		w.Write(page) //nolint:errcheck
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return s
}

// TestIdlePoolFirstRequest: a request to a pool idle for long enough that
// its servers are scraped rarely is answered at once, over the real ext_proc
// server, on the servers' last values (older than the staleness threshold,
// yet known: a sheddable request is not refused as if every endpoint were
// unknown) while the refresh it started is still held by the servers.
func TestIdlePoolFirstRequest(t *testing.T) {
	const staleness = 50 * time.Millisecond
	reg := datastore.NewRegistry()
	sched := newRealScheduler(t, reg)
	m, err := scrape.NewManager(scrape.Options{
		RefreshInterval: 20 * time.Millisecond, IdleRefreshInterval: time.Hour, DemandWindow: time.Second, StalenessThreshold: staleness,
	})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(m)
	ctx, cancel := context.WithCancel(context.Background())
	scraping := make(chan error, 1)
	go func() { scraping <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-scraping
	})

	hold, release := make(chan struct{}), make(chan struct{})
	busy := startHeldMetricsServer(t, "127.0.200.2", 0, vllmpage.State{Waiting: 9, Running: 4, KVCacheUsage: 0.5}, hold, release)
	port := busy.addr[len("127.0.200.2:"):]
	p, _ := strconv.Atoi(port)
	free := startHeldMetricsServer(t, "127.0.200.3", p, vllmpage.State{}, hold, release)
	defer close(release)

	pool := reg.Upsert(types.NamespacedName{Namespace: "idle", Name: "pool"}, &datastore.PoolSpec{
		Selector: map[string]string{"app": "idle"}, TargetPorts: []int32{int32(p)}, PickerService: "epp", PickerPort: 9002,
	})
	pool.SetPods([]datastore.EndpointSource{
		{Pod: types.NamespacedName{Namespace: "idle", Name: "busy"}, UID: "busy", IP: "127.0.200.2"},
		{Pod: types.NamespacedName{Namespace: "idle", Name: "free"}, UID: "free", IP: "127.0.200.3"},
	})
	pool.SetSynced(true)
	pool.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1}})

	// Idle: wait until both servers' interval has decayed past 160 ms and
	// their values are older than the staleness threshold.
	eventually(t, "the idle pool's servers to decay", func() bool {
		for _, e := range pool.Endpoints().Endpoints {
			if m := e.Metrics(); m == nil || m.Interval < 160*time.Millisecond || time.Since(m.ScrapedAt) <= staleness {
				return false
			}
		}
		return true
	})
	// From now on the servers hold every scrape.
	close(hold)

	ts := startServer(t, reg, sched, Options{Insecure: true})
	g := ts.open(t, "epp.idle.svc:9002", nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions", hdr{k: hdrObjective, v: "batch"}), false), duplex, duplex))
	g.send(reqBody(completionBody("m", 1), true))
	hr := g.recv()
	if ir := hr.GetImmediateResponse(); ir != nil {
		t.Fatalf("the idle pool's first request was refused: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	dest, _ := mutationHeader(hr.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
	if want := "127.0.200.3:" + port; len(dest) < len(want) || dest[:len(want)] != want {
		t.Errorf("picked %q, want the server with no queue (%s) first", dest, want)
	}
	// The refresh the request started reached both servers, which still
	// hold it: the answer did not wait for it.
	for _, s := range []*heldMetricsServer{busy, free} {
		select {
		case <-s.arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("no refresh of %s after the idle pool's first request", s.addr)
		}
	}
	if e, _ := pool.Endpoints().Get("127.0.200.3:" + port); e.InFlight() != 1 {
		t.Errorf("in-flight count of the picked endpoint %d, want 1", e.InFlight())
	}
}
