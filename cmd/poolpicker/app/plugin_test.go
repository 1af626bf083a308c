// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// viewRecorder is a scheduling plugin written as one outside poolpicker's
// module is: it imports the framework only, so the endpoints it scores are
// views with getters and nothing else (no SetMetrics, no AddInFlight: that
// it cannot reach a writer holds by construction). It records what its
// views say, counts picks in a metric registered through its factory's
// handle, and keeps the handle's context.
type viewRecorder struct {
	// waiting is the waiting requests the last scored endpoint's view
	// reported (-1: never scraped).
	waiting atomic.Int64
	// primary is the address PostPick saw picked.
	primary atomic.Pointer[string]
	picks   prometheus.Counter
	ctx     context.Context
}

const viewRecorderType = "view-recorder"

func (r *viewRecorder) TypedName() framework.TypedName {
	return framework.TypedName{Type: viewRecorderType, Name: viewRecorderType}
}

func (r *viewRecorder) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) {
	for i := range c {
		scores[i] = 1
		if m := c[i].Endpoint.Metrics(); m != nil {
			r.waiting.Store(int64(m.WaitingRequests))
		}
	}
}

func (r *viewRecorder) PostPick(_ context.Context, _ *framework.CycleState, _ *framework.Request, res *framework.Result) {
	a := res.Endpoints[0].Address()
	r.primary.Store(&a)
	r.picks.Inc()
}

// TestWithPlugin runs the command in-process with a plugin added by
// WithPlugin and named in the config file: the plugin is called, its views
// reflect the model server's live metrics (a change of the server's queue
// reaches it through the scraper), its metric is served on the metrics
// port, and its handle's context ends with the command.
func TestWithPlugin(t *testing.T) {
	writeKubeconfig(t)
	ns := env.Namespace(t, "plugin")

	var waiting atomic.Int64
	waiting.Store(3)
	const ip = "127.0.18.2"
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = vllmpage.Write(w, vllmpage.State{Waiting: int(waiting.Load()), Running: 1, KVCacheUsage: 0.1}, vllmpage.Options{})
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })
	port := lis.Addr().(*net.TCPAddr).Port
	readyPod(t, ns, "server", ip, map[string]string{"app": "m"})
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(port)}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: "+viewRecorderType+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	rec := &viewRecorder{}
	rec.waiting.Store(-1)
	factory := func(_ string, _ json.RawMessage, h framework.Handle) (framework.Plugin, error) {
		// Called once to check the config (a throwaway registerer), then
		// for the scheduler: the last call's handle is the serving one.
		rec.picks = prometheus.NewCounter(prometheus.CounterOpts{Name: "test_view_recorder_picks_total", Help: "Picks the test plugin heard of."})
		rec.ctx = h.Context()
		return rec, h.MetricsRegisterer().Register(rec.picks)
	}

	ports := freePorts(t, 3)
	args := []string{"--kubeconfig=" + kubeconfig, "--pool-name=pool", "--pool-namespace=" + ns, "--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false",
		"--config-file=" + config, fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() { done <- NewCommand(WithPlugin(viewRecorderType, factory)).Run(ctx, args, &stderr) }()

	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	if err := eppclient.WaitServing(waitCtx, fmt.Sprintf("127.0.0.1:%d", ports[1]), "readiness"); err != nil {
		t.Fatalf("readiness: %v; stderr:\n%s", err, stderr.String())
	}
	client := eppclient.New(fmt.Sprintf("127.0.0.1:%d", ports[0]), eppclient.Options{})
	defer client.Close()
	endpoint := net.JoinHostPort(ip, fmt.Sprint(port))
	// Picks until the plugin's view shows the server's queue at want: the
	// first request after an idle spell has the scraper refresh the pool.
	seeWaiting := func(want int64) {
		t.Helper()
		poll.Until(t, time.Minute, fmt.Sprintf("the plugin's view of %s to show %d waiting", endpoint, want), func() bool {
			res, err := client.Do(waitCtx, eppclient.Request{Shape: eppclient.FullDuplex, Body: []byte(`{"model":"m","prompt":"hi"}`)})
			if err != nil {
				t.Fatalf("request: %v; stderr:\n%s", err, stderr.String())
			}
			if got := res.Endpoints(); len(got) == 0 || got[0] != endpoint {
				t.Fatalf("picked %v, want %s", got, endpoint)
			}
			return rec.waiting.Load() == want
		})
	}
	seeWaiting(3)
	waiting.Store(7)
	seeWaiting(7)
	if p := rec.primary.Load(); p == nil || *p != endpoint {
		t.Fatalf("PostPick saw primary %v, want %s", p, endpoint)
	}
	// The plugin's metric, registered through its handle, is served.
	waitMetrics(t, ports[2], "test_view_recorder_picks_total ")

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("run returned %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if rec.ctx.Err() == nil {
		t.Fatal("the plugin's handle context is not done after the command stopped")
	}
}

// TestWithPluginTypeTaken: a plugin type added twice, or one a built-in
// plugin has, stops the command before anything starts, naming the type.
func TestWithPluginTypeTaken(t *testing.T) {
	f := func(string, json.RawMessage, framework.Handle) (framework.Plugin, error) { return &viewRecorder{}, nil }
	for name, opts := range map[string][]Option{
		"twice":    {WithPlugin(viewRecorderType, f), WithPlugin(viewRecorderType, f)},
		"built-in": {WithPlugin("queue-scorer", f)},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := NewCommand(opts...).Run(context.Background(), nil, &stderr); code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), "is already registered") {
				t.Fatalf("stderr %q names no taken type", stderr.String())
			}
		})
	}
}
