// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
	"github.com/poolpicker/poolpicker/scheduling"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	code := func() int {
		root, err := testenv.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		dir, err := CRDDir(context.Background(), root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		e, err := testenv.Start(testenv.Options{ExtraCRDDirs: []string{dir}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = e.Stop() }()
		if err := gwv1.Install(e.Scheme); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		env = e
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignore the process-wide goroutines client-go and klog start
// once and never stop.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"),
	goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/watch.(*Broadcaster).loop"),
}

func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{Verbosity: 2})
}

// simIPs hands out loopback /24s: this package's model servers live in
// 127.0.40.0/24 and up, apart from other packages' tests.
var (
	simMu   sync.Mutex
	simNext = 40 << 8
)

// simGroup starts n model servers on consecutive loopback IPs, all on one
// port (as pods of a pool share their target port).
func simGroup(t *testing.T, n int, opts modelsim.Options) ([]*modelsim.Server, int32) {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		simMu.Lock()
		base := simNext
		simNext += n + 1
		simMu.Unlock()
		ip := func(i int) string { return fmt.Sprintf("127.0.%d.%d", (base+i)>>8, (base+i)&0xff+2) }
		var sims []*modelsim.Server
		var port int32
		ok := true
		for i := 0; i < n && ok; i++ {
			o := opts
			o.Addr = net.JoinHostPort(ip(i), fmt.Sprint(port))
			s, err := modelsim.New(o)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				ok = false
				break
			}
			t.Cleanup(s.Stop)
			sims = append(sims, s)
			if port == 0 {
				// Our own listener's address: MustParse cannot fail.
				port = int32(netip.MustParseAddrPort(s.Addr()).Port())
			}
		}
		if ok {
			return sims, port
		}
		for _, s := range sims {
			s.Stop()
		}
	}
	t.Fatal("could not bind model servers")
	return nil, 0
}

// fastSim has no prefill or decode time.
var fastSim = modelsim.Options{PrefillPerToken: -1, DecodePerToken: -1, LoRALoadLatency: -1}

// picker is a real ext_proc server (package extproc) on loopback with its
// own registry, which the test fills as the pool controller would.
type picker struct {
	reg        *datastore.Registry
	addr       string
	healthAddr string
	cancel     context.CancelFunc
	done       chan error
}

func startPicker(t *testing.T, addr string, reg *datastore.Registry) *picker {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(nil, scheduling.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(sched)
	srv, err := extproc.New(reg, sched, extproc.Options{GRPCListener: l, HealthListener: hl, EnableConformanceTestBehaviors: true, DrainTimeout: time.Second, HealthInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &picker{reg: reg, addr: l.Addr().String(), healthAddr: hl.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- srv.Start(ctx) }()
	t.Cleanup(p.stop)
	return p
}

func (p *picker) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel = nil
}

// addPool registers a pool in the picker's registry with the sims' IPs.
func addPool(reg *datastore.Registry, ns, name, svc string, port int32, sims []*modelsim.Server) *datastore.Pool {
	var srcs []datastore.EndpointSource
	var targetPort int32
	for i, s := range sims {
		ap := netip.MustParseAddrPort(s.Addr())
		host := ap.Addr().String()
		targetPort = int32(ap.Port())
		srcs = append(srcs, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, i)}, UID: types.UID(fmt.Sprintf("%s-%s-%d", ns, name, i)), IP: host})
	}
	pool := reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
		Selector: map[string]string{"app": name}, TargetPorts: []int32{targetPort}, PickerService: svc, PickerPort: port,
	})
	pool.SetPods(srcs)
	pool.SetSynced(true)
	return pool
}

// createPool creates the InferencePool object the gateway reads.
func createPool(t *testing.T, ns, name, svc string, port, targetPort int32, mode v1.EndpointPickerFailureMode) {
	t.Helper()
	p := testPool(ns, name, svc, port)
	p.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(targetPort)}}
	p.Spec.EndpointPickerRef.FailureMode = mode
	if err := env.Client.Create(context.Background(), &p); err != nil {
		t.Fatalf("create pool: %v", err)
	}
}

func createRoute(t *testing.T, ns, name string, rules ...gwv1.HTTPRouteRule) *gwv1.HTTPRoute {
	t.Helper()
	r := &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "dev"}}},
			Rules:           rules,
		},
	}
	if err := env.Client.Create(context.Background(), r); err != nil {
		t.Fatalf("create route: %v", err)
	}
	return r
}

func headerRule(header, value, pool string) gwv1.HTTPRouteRule {
	return gwv1.HTTPRouteRule{
		Matches:     []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Type: ptr.To(gwv1.HeaderMatchExact), Name: gwv1.HTTPHeaderName(header), Value: value}}}},
		BackendRefs: []gwv1.HTTPBackendRef{poolRef(pool, 1)},
	}
}

// startGateway runs a gateway for the namespace's Gateway "dev".
func startGateway(t *testing.T, ns string, opts Options) *Gateway {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	opts.Gateway = types.NamespacedName{Namespace: ns, Name: "dev"}
	if opts.Logger.GetSink() == nil {
		opts.Logger = testLogger(t)
	}
	g, err := New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	select {
	case <-g.Ready():
	case err := <-done:
		t.Fatalf("gateway: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gateway not ready")
	}
	return g
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

type result struct {
	code    int
	header  http.Header
	body    string
	elapsed time.Duration
}

func do(t *testing.T, c *http.Client, g *Gateway, path, body string, hdr map[string]string) result {
	t.Helper()
	method := "POST"
	if body == "" {
		method = "GET"
	}
	req, _ := http.NewRequest(method, "http://"+g.Addr()+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return result{resp.StatusCode, resp.Header, string(b), time.Since(start)}
}

// eventually polls cond until it holds; for states nothing signals.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, what, cond)
}

// fixedPicker is a minimal ext_proc server answering every request with a
// fixed destination header and metadata (which may differ, to test the
// gateway's check), echoing bodies in FULL_DUPLEX_STREAMED style; it records
// the served endpoints the gateway reports.
type fixedPicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest, meta string
	mu         sync.Mutex
	served     []string
	authority  []string
}

func (f *fixedPicker) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	if md, ok := metadataFrom(s.Context()); ok {
		f.mu.Lock()
		f.authority = append(f.authority, md)
		f.mu.Unlock()
	}
	decide := func(withBody []byte, eos bool) error {
		mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(f.dest)}}}}
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut}}},
			DynamicMetadata: destinationStruct(f.meta)}
		if err := s.Send(resp); err != nil {
			return err
		}
		if withBody == nil {
			return nil
		}
		return s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: withBody, EndOfStream: eos}}}}}}})
	}
	var body []byte
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.GetEndOfStream() {
				if err := decide(nil, false); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if r.RequestBody.GetEndOfStream() {
				if err := decide(body, true); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			served := req.GetMetadataContext().GetFilterMetadata()[MetadataNamespaceLB].GetFields()[MetadataKeyServed].GetStringValue()
			f.mu.Lock()
			f.served = append(f.served, served)
			f.mu.Unlock()
			if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: r.ResponseBody.GetBody(), EndOfStream: r.ResponseBody.GetEndOfStream()}}}}}}}); err != nil {
				return err
			}
		}
	}
}

func startFixedPicker(t *testing.T, f *fixedPicker) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return l.Addr().String()
}

func metadataFrom(ctx context.Context) (string, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get(":authority")) == 0 {
		return "", false
	}
	return md.Get(":authority")[0], true
}

func destinationStruct(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{HeaderDestination: structpb.NewStringValue(dest)}}),
	}}
}

// createReadyPod creates a pod labelled app=pool and marks it Ready with ip
// through the status subresource, as a kubelet would.
func createReadyPod(t *testing.T, ns, name, pool, ip string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": pool}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "model", Image: "modelsim"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}
