// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// modelServer is a model server's /metrics on a loopback IP of its own.
type modelServer struct {
	ip       string
	port     int
	addr     string
	srv      *http.Server
	requests atomic.Int64
	behave   atomic.Pointer[http.HandlerFunc]
	// accepted and open count the connections the server accepted and
	// holds open.
	accepted, open atomic.Int64
}

// startModelServers starts n servers on 127.0.0.2, 127.0.0.3, ... sharing one port.
func startModelServers(t *testing.T, n int) []*modelServer {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		servers, err := listenAll(n)
		if err == nil {
			t.Cleanup(func() {
				for _, s := range servers {
					s.srv.Close()
				}
			})
			return servers
		}
	}
	t.Fatal("no common free port on the loopback IPs")
	return nil
}

func listenAll(n int) ([]*modelServer, error) {
	var servers []*modelServer
	var listeners []net.Listener
	port := 0
	for i := 0; i < n; i++ {
		ip := "127.0.0." + strconv.Itoa(2+i)
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return nil, err
		}
		port = ln.Addr().(*net.TCPAddr).Port
		listeners = append(listeners, ln)
		s := &modelServer{ip: ip, port: port, addr: ln.Addr().String()}
		s.serve(http.StatusOK, nil)
		s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.requests.Add(1)
			(*s.behave.Load())(w, r)
		}), ReadHeaderTimeout: 10 * time.Second, ConnState: s.track}
		servers = append(servers, s)
	}
	for i, s := range servers {
		go s.srv.Serve(listeners[i]) //nolint:errcheck // ends with Close
	}
	return servers, nil
}

// track counts the server's connections.
func (s *modelServer) track(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		s.accepted.Add(1)
		s.open.Add(1)
	case http.StateClosed, http.StateHijacked:
		s.open.Add(-1)
	}
}

func (s *modelServer) set(h http.HandlerFunc) { s.behave.Store(&h) }

// serve answers every request with code and body.
func (s *modelServer) serve(code int, body []byte) {
	s.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(code)
		w.Write(body) //nolint:errcheck
	})
}

func (s *modelServer) servePage(t testing.TB, st vllmpage.State, o vllmpage.Options) {
	s.serve(http.StatusOK, mustPage(t, st, o))
}

// block makes the server hold each request until its client goes away,
// reporting each arrival on the returned channel.
func (s *modelServer) block() <-chan struct{} {
	arrived := make(chan struct{}, 100)
	s.set(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	return arrived
}

type scrapeEvent struct {
	pool    datastore.PoolKey
	address string
	err     error
}

type harness struct {
	reg    *datastore.Registry
	m      *Manager
	prom   *prometheus.Registry
	events chan scrapeEvent
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{reg: datastore.NewRegistry(), prom: prometheus.NewRegistry(), events: make(chan scrapeEvent, 4096)}
	if opts.Registerer == nil {
		opts.Registerer = h.prom
	}
	if opts.IdleRefreshInterval == 0 {
		// Every server every RefreshInterval, busy or not, unless the test
		// is about idle servers.
		opts.IdleRefreshInterval = -1
	}
	m, err := NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	m.onScrape = func(pool datastore.PoolKey, address string, err error) {
		select {
		case h.events <- scrapeEvent{pool, address, err}:
		default: // a test not listening drops events; waits match on content
		}
	}
	h.m = m
	h.reg.AddObserver(m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start returned %v", err)
		}
	})
	return h
}

// await returns the first scrape event satisfying ok, failing the test after 10s.
func (h *harness) await(t *testing.T, what string, ok func(scrapeEvent) bool) scrapeEvent {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case ev := <-h.events:
			if ok(ev) {
				return ev
			}
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (h *harness) awaitSuccess(t *testing.T, addr string) {
	t.Helper()
	h.await(t, "a good scrape of "+addr, func(ev scrapeEvent) bool { return ev.address == addr && ev.err == nil })
}

func (h *harness) awaitError(t *testing.T, addr, reason string) scrapeEvent {
	t.Helper()
	return h.await(t, reason+" error from "+addr, func(ev scrapeEvent) bool {
		var se *scrapeError
		return ev.address == addr && errors.As(ev.err, &se) && se.Reason == reason
	})
}

// awaitScrapes waits for n more scrapes of addr, good or not.
func (h *harness) awaitScrapes(t *testing.T, addr string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		h.await(t, fmt.Sprintf("scrape %d of %s", i+1, addr), func(ev scrapeEvent) bool { return ev.address == addr })
	}
}

func pods(labels map[string]string, servers ...*modelServer) []datastore.EndpointSource {
	var out []datastore.EndpointSource
	for _, s := range servers {
		out = append(out, datastore.EndpointSource{
			Pod: types.NamespacedName{Namespace: "ns", Name: "pod-" + s.ip}, UID: types.UID("uid-" + s.ip), IP: s.ip, Labels: labels,
		})
	}
	return out
}

func (h *harness) addPool(name string, ann map[string]string, port int, servers ...*modelServer) *datastore.Pool {
	p := h.reg.Upsert(types.NamespacedName{Namespace: "ns", Name: name}, &datastore.PoolSpec{
		Selector: map[string]string{"app": name}, TargetPorts: []int32{int32(port)}, Annotations: ann,
	})
	p.SetPods(pods(nil, servers...))
	return p
}

func endpointOf(t *testing.T, p *datastore.Pool, addr string) *datastore.Endpoint {
	t.Helper()
	e, ok := p.Endpoints().Get(addr)
	if !ok {
		t.Fatalf("pool %s has no endpoint %s", p.Key, addr)
	}
	return e
}

// series returns the registry's samples of the family for pool name, keyed
// by the values of the other labels.
func (h *harness) series(t *testing.T, family, pool string) map[string]float64 {
	t.Helper()
	fams, err := h.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.Metric {
			var key string
			match := false
			for _, l := range m.Label {
				switch l.GetName() {
				case "name":
					match = l.GetValue() == pool
				case "namespace":
				default:
					key += l.GetValue()
				}
			}
			if match {
				out[key] = value(m)
			}
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.GetGauge().GetValue()
}

// testPoller runs a poller of m's for a test: fetch scrapes one server on
// it, as the manager's dispatcher does, and waits for the result.
type testPoller struct {
	p    fetch.Fetcher
	mu   sync.Mutex
	ends map[*server]chan polled
}

func startPoller(t testing.TB, m *Manager) *testPoller {
	t.Helper()
	tp := &testPoller{ends: map[*server]chan polled{}}
	p, err := fetch.New(fetch.Options{
		MaxPageBytes: m.opts.MaxBodyBytes, Timeout: m.opts.Timeout, Kept: &m.kept,
		Parse: m.parsePolled,
		Complete: func(c *fetch.Conn, r fetch.Result) {
			s := c.Owner.(*server)
			tp.mu.Lock()
			ch := tp.ends[s]
			delete(tp.ends, s)
			tp.mu.Unlock()
			met := s.polled
			s.polled = datastore.Metrics{}
			ch <- polled{met: met, err: r.Err, cancelled: r.Cancelled, cpu: r.CPU, read: r.Read}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tp.p = p
	var wg sync.WaitGroup
	wg.Go(p.Run)
	t.Cleanup(func() { p.Stop(); wg.Wait() })
	return tp
}

// start submits a scrape of s and returns the channel its result comes on.
func (tp *testPoller) start(s *server) <-chan polled {
	ch := make(chan polled, 1)
	tp.mu.Lock()
	tp.ends[s] = ch
	tp.mu.Unlock()
	s.conn.ClearCancel()
	tp.p.Submit(s.conn)
	return ch
}

func (tp *testPoller) fetch(s *server) (datastore.Metrics, error) {
	r := <-tp.start(s)
	if r.cancelled {
		return datastore.Metrics{}, errors.New("cancelled")
	}
	return r.met, r.err
}

// unstartedManager returns a manager with a budget of one core that
// observes a new registry and is not started: the test runs its plans.
func unstartedManager(tb testing.TB) (*Manager, *datastore.Registry) {
	tb.Helper()
	m, err := NewManager(Options{Registerer: prometheus.NewRegistry(), CPUBudget: 1})
	if err != nil {
		tb.Fatal(err)
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(m)
	return m, reg
}

// addIPPool adds pool name in namespace ns with a pod at each of ips, its
// target port 8000.
func addIPPool(reg *datastore.Registry, name string, ips ...string) *datastore.Pool {
	p := reg.Upsert(types.NamespacedName{Namespace: "ns", Name: name}, &datastore.PoolSpec{
		Selector: map[string]string{"app": name}, TargetPorts: []int32{8000},
	})
	var src []datastore.EndpointSource
	for _, ip := range ips {
		src = append(src, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: name + "-" + ip}, UID: types.UID(name + ip), IP: ip})
	}
	p.SetPods(src)
	return p
}
