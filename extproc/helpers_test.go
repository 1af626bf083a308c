// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/scheduling"
)

// leastInFlight is a test scheduler that really picks: among the pool's
// endpoints allowed by the subset hint and candidate IPs, the one with the
// fewest requests in flight (ties by address), then up to two fallbacks in
// the same order. It counts every pool saturated, so that every request
// whose objective has a negative priority is shed. It asks for the whole
// prompt, so the server validates every body in full.
type leastInFlight struct{}

func (leastInFlight) PromptBytes() int { return math.MaxInt }

func (leastInFlight) AdmissionSaturated(pool *datastore.Pool) (bool, string) {
	return pool.Endpoints().Len() > 0, "the test scheduler counts every pool saturated"
}

func (l leastInFlight) ScheduleDeferred(_ context.Context, pool *datastore.Pool, req *scheduling.Request) (*scheduling.Result, error) {
	var cands []*datastore.Endpoint
	for _, e := range pool.Endpoints().Endpoints {
		if req.Subset != nil && !slices.Contains(req.Subset, e.Address) {
			continue
		}
		if req.CandidateIPs != nil && !slices.Contains(req.CandidateIPs, e.IP) {
			continue
		}
		cands = append(cands, e)
	}
	if len(cands) == 0 {
		return nil, scheduling.NewNoEndpointsError("pool %s has no eligible endpoint", pool.Key)
	}
	slices.SortStableFunc(cands, func(a, b *datastore.Endpoint) int {
		if d := a.InFlight() - b.InFlight(); d != 0 {
			if d < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Address, b.Address)
	})
	return &scheduling.Result{Endpoints: cands[:min(3, len(cands))], Profile: "test"}, nil
}

// poolFixture is a registry of pools; pool i lives in namespace ns-(i%5),
// is named pool-i, has picker Service epp-i on port 9002 and pods on
// loopback IPs 127.0.(i+1).(j+2) with target port 8000.
type poolFixture struct {
	reg   *datastore.Registry
	pools []*datastore.Pool
}

func poolNS(i int) string   { return fmt.Sprintf("ns-%d", i%5) }
func poolName(i int) string { return fmt.Sprintf("pool-%d", i) }
func poolSvc(i int) string  { return fmt.Sprintf("epp-%d", i) }

func newPools(t testing.TB, n, podsPerPool int) *poolFixture {
	t.Helper()
	f := &poolFixture{reg: datastore.NewRegistry()}
	for i := 0; i < n; i++ {
		f.add(i, poolNS(i), poolName(i), poolSvc(i), 9002, podsPerPool)
	}
	return f
}

func (f *poolFixture) add(i int, ns, name, svc string, port int32, pods int) *datastore.Pool {
	p := f.reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
		Selector: map[string]string{"app": name}, TargetPorts: []int32{8000}, PickerService: svc, PickerPort: port,
	})
	var srcs []datastore.EndpointSource
	for j := 0; j < pods; j++ {
		srcs = append(srcs, datastore.EndpointSource{
			Pod: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("%s-pod-%d", name, j)},
			UID: types.UID(fmt.Sprintf("uid-%d-%d", i, j)),
			IP:  fmt.Sprintf("127.0.%d.%d", i+1, j+2),
		})
	}
	p.SetPods(srcs)
	p.SetSynced(true)
	f.pools = append(f.pools, p)
	return p
}

// totalInFlight sums the in-flight counts of every endpoint of every pool.
func (f *poolFixture) totalInFlight() int64 {
	var n int64
	for _, p := range f.reg.Pools() {
		for _, e := range p.Endpoints().Endpoints {
			n += e.InFlight()
		}
	}
	return n
}

// testServer is a running Server on loopback ports.
type testServer struct {
	srv        *Server
	addr       string
	healthAddr string
	prom       *prometheus.Registry
	cancel     context.CancelFunc
	done       chan error
	// client dials the server as a gateway does, one connection per
	// :authority.
	client *eppclient.Client
}

func startServer(t testing.TB, reg *datastore.Registry, sched Scheduler, opts Options) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.GRPCListener, opts.HealthListener = lis, hlis
	prom := prometheus.NewRegistry()
	if opts.Registerer == nil {
		opts.Registerer = prom
	}
	if opts.HealthInterval == 0 {
		opts.HealthInterval = 20 * time.Millisecond
	}
	srv, err := New(reg, sched, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, addr: lis.Addr().String(), healthAddr: hlis.Addr().String(), prom: prom, cancel: cancel, done: make(chan error, 1),
		client: eppclient.New(lis.Addr().String(), eppclient.Options{TLS: !opts.Insecure})}
	go func() { ts.done <- srv.Start(ctx) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

func (ts *testServer) stop(t testing.TB) {
	_ = ts.client.Close()
	ts.cancel()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("Start returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Start did not return after cancel")
	}
}

// conn returns a client connection whose streams carry :authority a
// (empty: the dial address).
func (ts *testServer) conn(t testing.TB, authority string) *grpc.ClientConn {
	t.Helper()
	c, err := ts.client.Conn(authority)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gw is one simulated gateway stream.
type gw struct {
	t      testing.TB
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (ts *testServer) open(t testing.TB, authority string, md metadata.MD) *gw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	if md != nil {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	s, err := extprocv3.NewExternalProcessorClient(ts.conn(t, authority)).Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	g := &gw{t: t, stream: s, cancel: cancel}
	t.Cleanup(cancel)
	return g
}

func (g *gw) send(m *extprocv3.ProcessingRequest) {
	g.t.Helper()
	if err := g.stream.Send(m); err != nil {
		g.t.Fatalf("send: %v", err)
	}
}

// recv reads one answer, failing the test if none arrives within d (a
// server that waits where the gateway waits hangs here).
func (g *gw) recvWithin(d time.Duration) *extprocv3.ProcessingResponse {
	g.t.Helper()
	type res struct {
		m   *extprocv3.ProcessingResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := g.stream.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			g.t.Fatalf("recv: %v", r.err)
		}
		return r.m
	case <-time.After(d):
		g.cancel()
		<-ch
		g.t.Fatalf("no answer within %v", d)
	}
	return nil
}

func (g *gw) recv() *extprocv3.ProcessingResponse { g.t.Helper(); return g.recvWithin(5 * time.Second) }

// expectEOF closes the gateway side and expects the server to end the
// stream cleanly.
func (g *gw) expectEOF() {
	g.t.Helper()
	_ = g.stream.CloseSend()
	if m, err := g.stream.Recv(); !errors.Is(err, io.EOF) {
		g.t.Fatalf("want EOF after close, got %v, %v", m, err)
	}
}

type hdr struct {
	k, v string
	raw  bool
}

func headerMap(hs []hdr) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		hv := &corev3.HeaderValue{Key: h.k}
		if h.raw {
			hv.RawValue = []byte(h.v)
		} else {
			hv.Value = h.v
		}
		m.Headers = append(m.Headers, hv)
	}
	return m
}

// envoyHeaders are the request headers an Envoy-based gateway sends: HTTP/2
// pseudo-headers, lower-case names, values in RawValue.
func envoyHeaders(method, path string, extra ...hdr) []hdr {
	hs := []hdr{{":method", method, true}, {":path", path, true}, {":authority", "gateway.example.com", true}, {":scheme", "http", true}, {"x-request-id", "req-1", true}}
	return append(hs, extra...)
}

func reqHeaders(hs []hdr, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs), EndOfStream: eos}}}
}

func withProtocol(m *extprocv3.ProcessingRequest, req, resp filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return m
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func respHeaders(hs []hdr, eos bool, served string) *extprocv3.ProcessingRequest {
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs), EndOfStream: eos}}}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataNamespaceLB: {Fields: map[string]*structpb.Value{HeaderDestinationServed: structpb.NewStringValue(served)}},
		}}
	}
	return m
}

func respBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// mutationHeader returns the value set for key by a header mutation.
func mutationHeader(m *extprocv3.HeaderMutation, key string) (string, bool) {
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetKey() == key {
			return headerValue(o.GetHeader()), true
		}
	}
	return "", false
}

// destination checks that a response names the same destination in its
// header mutation (RawValue) and in envoy.lb dynamic metadata, and returns it.
func destination(t testing.TB, resp *extprocv3.ProcessingResponse, m *extprocv3.HeaderMutation) string {
	t.Helper()
	var raw string
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetKey() == HeaderDestination {
			if len(o.GetHeader().GetRawValue()) == 0 {
				t.Fatalf("destination header not in RawValue: %v", o)
			}
			raw = string(o.GetHeader().GetRawValue())
		}
	}
	if raw == "" {
		t.Fatalf("no %s header in %v", HeaderDestination, resp)
	}
	md, ok := structString(resp.GetDynamicMetadata().GetFields()[MetadataNamespaceLB].GetStructValue(), HeaderDestination)
	if !ok || md != raw {
		t.Fatalf("metadata destination %q differs from header %q", md, raw)
	}
	return raw
}

func immediateCode(t testing.TB, resp *extprocv3.ProcessingResponse) (int, string) {
	t.Helper()
	ir := resp.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", resp)
	}
	return int(ir.GetStatus().GetCode()), string(ir.GetBody())
}

// metricSum adds up every series of a counter or histogram vector (the
// sample sum for histograms, the value for counters).
func metricSum(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var pb dto.Metric
		_ = m.Write(&pb)
		switch {
		case pb.Counter != nil:
			sum += pb.Counter.GetValue()
		case pb.Histogram != nil:
			sum += pb.Histogram.GetSampleSum()
		}
	}
	return sum
}

// metricCount adds up the observation counts of a histogram vector.
func metricCount(c prometheus.Collector) uint64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var n uint64
	for m := range ch {
		var pb dto.Metric
		_ = m.Write(&pb)
		n += pb.Histogram.GetSampleCount()
	}
	return n
}

func mustListen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eventually polls cond until it holds, failing the test after 20 s: only
// for states nothing signals, such as accounting the server finishes on a
// stream's goroutine after its client went away.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, what, cond)
}
