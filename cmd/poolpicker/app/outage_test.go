// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// The election of the outage tests: short, so that the tests are quick,
// and a renew deadline of seconds, so that a busy machine's slow answer
// does not depose the leader before the outage.
const (
	outageLease       = 4 * time.Second
	outageRenew       = 3 * time.Second
	outageRetryPeriod = 500 * time.Millisecond
)

// outageHold is how long TestAPIServerOutageUnderTraffic holds the API
// server frozen, counted from the Lease's last renewal.
var outageHold = flag.Duration("outage-hold", 3*outageLease, "how long the outage test holds the API server frozen, from the Lease's last renewal (past 45 s, client-go's health checks cut the connections)")

// outagePool is a namespace with a pool of real model servers (modelsim)
// on their own loopback addresses, and a picker's flags for it reaching
// the API server through an Outage.
type outagePool struct {
	ns, picker string
	outage     *testenv.Outage
	pods       []string // pod names, by model server
	addrs      []string // ip:port, by model server
	ports      []int    // ext_proc, health, metrics
	args       []string
}

func newOutagePool(t *testing.T, prefix string, firstIP int) *outagePool {
	t.Helper()
	ctx := context.Background()
	p := &outagePool{ns: env.Namespace(t, prefix), picker: prefix, outage: env.OutageProxy(t), ports: freePorts(t, 3)}
	port := 0
	for i := range 2 {
		ip := fmt.Sprintf("127.0.%d.%d", firstIP, 2+i)
		lis, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		if err != nil {
			t.Fatal(err)
		}
		port = lis.Addr().(*net.TCPAddr).Port
		ms, err := modelsim.New(modelsim.Options{Listener: lis, Model: "m", DefaultMaxTokens: 2, DecodePerToken: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := ms.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ms.Stop)
		name := fmt.Sprintf("server-%d", i)
		readyPod(t, p.ns, name, ip, map[string]string{"app": "m"})
		p.pods = append(p.pods, name)
		p.addrs = append(p.addrs, net.JoinHostPort(ip, fmt.Sprint(port)))
	}
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "pool", Labels: map[string]string{"poolpicker.io/picker": p.picker}}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(port)}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(p.outage.Config, kc); err != nil {
		t.Fatal(err)
	}
	p.args = []string{"--kubeconfig=" + kc, "--watch-namespaces=" + p.ns, "--secure-serving=false", "--metrics-endpoint-auth=false",
		"--picker-name=" + p.picker, "--picker-namespace=" + p.ns, "--ha-enable-leader-election",
		"--ha-leader-election-lease-duration=" + outageLease.String(), "--ha-leader-election-renew-deadline=" + outageRenew.String(),
		"--ha-leader-election-retry-period=" + outageRetryPeriod.String(),
		fmt.Sprintf("--grpc-port=%d", p.ports[0]), fmt.Sprintf("--grpc-health-port=%d", p.ports[1]), fmt.Sprintf("--metrics-port=%d", p.ports[2]), "-v=2"}
	return p
}

// leaseRenewedAgo is how long ago the picker's Lease was last renewed, as
// the API server itself (not the proxy) has it.
func (p *outagePool) leaseRenewedAgo(t *testing.T) (time.Duration, bool) {
	var l coordinationv1.Lease
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: p.ns, Name: p.picker}, &l); err != nil || l.Spec.RenewTime == nil {
		return 0, false
	}
	return time.Since(l.Spec.RenewTime.Time), true
}

// request plays a gateway for one request: the picker's choice over
// ext_proc, the request to that model server, and its answer back through
// the response phase. It returns the endpoint that served it.
func request(ctx context.Context, conn *grpc.ClientConn, httpc *http.Client) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "", err
	}
	body := `{"model":"m","prompt":"hello there","max_tokens":2}`
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}}); err != nil {
		return "", err
	}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}); err != nil {
		return "", err
	}
	first, err := s.Recv()
	if err != nil {
		return "", fmt.Errorf("picking: %w", err)
	}
	if ir := first.GetImmediateResponse(); ir != nil {
		return "", fmt.Errorf("refused: %v %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	endpoint := ""
	for _, h := range first.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.HeaderDestination {
			// The primary, before the fallbacks.
			endpoint, _, _ = strings.Cut(string(h.GetHeader().GetRawValue()), ",")
		}
	}
	if endpoint == "" {
		return "", fmt.Errorf("no %s in %v", extproc.HeaderDestination, first)
	}
	if _, err := s.Recv(); err != nil { // the body answer
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return "", fmt.Errorf("model server %s: %w", endpoint, err)
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", fmt.Errorf("model server %s: %w", endpoint, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("model server %s: status %d", endpoint, resp.StatusCode)
	}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("application/json")}}}}}}); err != nil {
		return "", err
	}
	if _, err := s.Recv(); err != nil {
		return "", err
	}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: respBody, EndOfStream: true}}}); err != nil {
		return "", err
	}
	if _, err := s.Recv(); err != nil {
		return "", err
	}
	_ = s.CloseSend()
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("stream did not end: %w", err)
	}
	return endpoint, nil
}

// traffic sends requests one after the other until stopped, recording
// when each ended and how.
type traffic struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	sent   []outcome
}

type outcome struct {
	at       time.Time
	endpoint string
	err      error
}

func startTraffic(t *testing.T, grpcPort int) *traffic {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	httpc := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	l := &traffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer conn.Close()
		defer tr.CloseIdleConnections()
		for ctx.Err() == nil {
			ep, err := request(ctx, conn, httpc)
			if ctx.Err() != nil {
				return // stopped mid-request: not an outcome
			}
			l.mu.Lock()
			l.sent = append(l.sent, outcome{at: time.Now(), endpoint: ep, err: err})
			l.mu.Unlock()
		}
	}()
	t.Cleanup(l.stop)
	return l
}

func (l *traffic) stop() {
	l.cancel()
	<-l.done
}

func (l *traffic) outcomes() []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outcome(nil), l.sent...)
}

// count waits until n more requests have ended than had at from.
func (l *traffic) await(t *testing.T, from, n int) {
	t.Helper()
	poll.Until(t, 60*time.Second, fmt.Sprintf("%d requests", n), func() bool { return len(l.outcomes()) >= from+n })
}

// TestAPIServerOutageUnderTraffic runs the binary with leader election
// against the API server through a proxy, under steady traffic to a synced
// pool of two model servers, and freezes the proxy (what SIGSTOP does to
// the API server) until its Lease is three lease durations old
// (-outage-hold): no request fails, the process
// stays up and ready, and the leader steps down (poolpicker_leader 0)
// instead of exiting. Resumed, it leads again, and follows a pod change
// made after the outage.
func TestAPIServerOutageUnderTraffic(t *testing.T) {
	p := newOutagePool(t, "outage", 22)
	exited, stderr := startBinary(t, p.args, nil)
	waitHealthServing(t, p.ports[1], exited, stderr, "readiness")
	waitMetrics(t, p.ports[2], "poolpicker_leader 1", fmt.Sprintf(`inference_pool_ready_pods{name="pool",namespace="%s"} 2`, p.ns))
	load := startTraffic(t, p.ports[0])
	load.await(t, 0, 10)

	p.outage.Freeze()
	frozen := time.Now()
	before := len(load.outcomes())
	waitMetrics(t, p.ports[2], "poolpicker_leader 0")
	stepDown := time.Since(frozen)
	// Held until the Lease has been expired for two more lease durations
	// (-outage-hold), as the API server has it.
	poll.Until(t, *outageHold+time.Minute, fmt.Sprintf("the Lease to be %v old", *outageHold), func() bool {
		ago, ok := p.leaseRenewedAgo(t)
		return ok && ago > *outageHold
	})
	select {
	case <-exited:
		t.Fatalf("exited during the outage; stderr:\n%s", stderr.String())
	default:
	}
	waitHealthServing(t, p.ports[1], exited, stderr, "readiness", "liveness")
	during := len(load.outcomes()) - before
	outageLasted := time.Since(frozen)

	p.outage.Resume()
	resumed := time.Now()
	waitMetrics(t, p.ports[2], "poolpicker_leader 1")
	reacquired := time.Since(resumed)

	// After the outage, one model server turns unready: the picker follows.
	var pod corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: p.ns, Name: p.pods[0]}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	if err := env.Client.Status().Update(context.Background(), &pod); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, p.ports[2], fmt.Sprintf(`inference_pool_ready_pods{name="pool",namespace="%s"} 1`, p.ns))
	after := len(load.outcomes())
	load.await(t, after, 10)
	load.stop()

	all := load.outcomes()
	var failed []string
	for _, o := range all {
		if o.err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", o.at.Format(time.StampMilli), o.err))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed (outage from %s to %s):\n%s", len(failed), len(all), frozen.Format(time.StampMilli), resumed.Format(time.StampMilli), strings.Join(failed, "\n"))
	}
	if during < 10 {
		t.Errorf("%d requests during the %v outage, want a steady stream", during, outageLasted)
	}
	// The request under way when the change was seen may have been picked
	// before it.
	for _, o := range all[after+1:] {
		if o.err == nil && o.endpoint != p.addrs[1] {
			t.Errorf("request after the pod change served by %s, want %s (the only ready one)", o.endpoint, p.addrs[1])
		}
	}
	if !strings.Contains(stderr.String(), "lost the Lease") {
		t.Errorf("no log line of the lost Lease; stderr:\n%s", stderr.String())
	}
	t.Logf("%d requests, %d during the outage of %v; stepped down %v after the freeze (renew deadline %v), leader again %v after it ended",
		len(all), during, outageLasted.Round(time.Millisecond), stepDown.Round(time.Millisecond), outageRenew, reacquired.Round(time.Millisecond))
}

// TestReplicaStartedDuringAnOutage starts the binary while the API server
// does not answer: it stays up and live, reports not ready with the reason
// (readiness NOT_SERVING, poolpicker_waiting_for_api_server 1, a log line)
// and refuses streams as not ready; once the API server answers, it syncs,
// turns ready and routes.
func TestReplicaStartedDuringAnOutage(t *testing.T) {
	p := newOutagePool(t, "late", 23)
	p.outage.Freeze()
	exited, stderr := startBinary(t, p.args, nil)
	waitHealthServing(t, p.ports[1], exited, stderr, "liveness")
	waitMetrics(t, p.ports[2], "poolpicker_waiting_for_api_server 1")
	// Asked twice and still waiting: no exit, no crash loop.
	poll.Until(t, 2*time.Minute, "a second attempt", func() bool {
		return strings.Count(stderr.String(), "waiting for the API server") >= 2
	})
	select {
	case <-exited:
		t.Fatalf("exited during the outage; stderr:\n%s", stderr.String())
	default:
	}
	if got := healthStatus(t, p.ports[1], "readiness"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness %v while the API server does not answer, want NOT_SERVING", got)
	}
	if !strings.Contains(stderr.String(), "waiting for the API server") {
		t.Errorf("no log line saying why it is not ready; stderr:\n%s", stderr.String())
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", p.ports[0]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	httpc := &http.Client{Transport: &http.Transport{}}
	if _, err := request(context.Background(), conn, httpc); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("a request before the first sync: %v, want refused as not ready", err)
	}

	p.outage.Resume()
	resumed := time.Now()
	waitHealthServing(t, p.ports[1], exited, stderr, "readiness")
	ready := time.Since(resumed)
	waitMetrics(t, p.ports[2], "poolpicker_waiting_for_api_server 0", "poolpicker_leader 1")
	ep, err := request(context.Background(), conn, httpc)
	if err != nil {
		t.Fatalf("a request once ready: %v", err)
	}
	if ep != p.addrs[0] && ep != p.addrs[1] {
		t.Errorf("routed to %s, want one of %v", ep, p.addrs)
	}
	t.Logf("ready %v after the API server answered again", ready.Round(time.Millisecond))
}

// healthStatus asks the health service once.
func healthStatus(t *testing.T, port int, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		var zero healthpb.HealthCheckResponse_ServingStatus
		t.Fatalf("health check %q: %v", svc, errors.Join(err))
		return zero
	}
	return resp.GetStatus()
}
