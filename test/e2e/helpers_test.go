// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/types"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/internal/devgateway"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var (
	stack  *localstack.Stack
	client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 2 * time.Minute}
)

// Picker settings of the suite: a staleness window short enough to wait
// for, and a small body limit so the 413 case is cheap.
const (
	staleness    = time.Second
	maxBodyBytes = 1 << 20
	retryWindow  = 30 * time.Second
	// pickerReplicas is how many poolpicker processes serve the suite.
	pickerReplicas = 2
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ports, err := freePorts(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	// Kept after the run (and ignored by git) for post-mortems: the
	// kubeconfig, the picker binary and its log.
	dir, err := filepath.Abs(".artifacts")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = os.RemoveAll(dir)
	s, err := localstack.Start(context.Background(), localstack.Options{
		Dir:     dir,
		FirstIP: "127.0.50.2",
		// The shared-picker topology: two replicas in poolpicker-system,
		// pools in other namespaces reached only through the picker
		// Services and EndpointSlices the leader provisions.
		PickerReplicas: pickerReplicas,
		FirstPickerIP:  "127.0.51.2",
		GatewayAddr:    "127.0.0.1:0",
		GRPCPort:       ports[0], HealthPort: ports[1], MetricsPort: ports[2],
		// A race-enabled picker: the suite also hunts races in the real
		// process, and the build reuses the race-built packages of the run.
		PickerBuildFlags: []string{"-race"},
		PickerArgs: []string{
			fmt.Sprintf("--metrics-staleness-threshold=%s", staleness),
			fmt.Sprintf("--max-request-body-bytes=%d", maxBodyBytes),
			"--drain-timeout=5s",
			"--drain-grace-period=1s",
			// A killed leader is replaced within a few seconds.
			"--ha-leader-election-lease-duration=3s",
			"--ha-leader-election-renew-deadline=2s",
			"--ha-leader-election-retry-period=500ms",
			"-v=2",
		},
		Gateway: devgateway.Options{ExtProcRetryWindow: retryWindow},
		Logger:  funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, p, a) }, funcr.Options{Verbosity: 0}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the local stack:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: local stack up in %s (gateway %s, poolpicker log %s)\n", time.Since(start).Round(time.Millisecond), s.GatewayURL, s.Picker.Log)
	stack = s
	code := m.Run()
	client.CloseIdleConnections()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping the local stack:", err)
		code = 1
	}
	for _, r := range s.Replicas() {
		if logBytes, raced := testenv.RaceReported(r.Process.Log); raced {
			fmt.Fprintf(os.Stderr, "e2e: poolpicker replica %s reported a data race:\n%s\n", r.Pod, logBytes)
			code = 1
		}
	}
	if code == 0 {
		if err := testenv.LeakedGoroutines(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: goroutines left behind:", err)
			code = 1
		}
	}
	return code
}

func freePorts(n int) ([]int, error) { return localstack.FreePorts(n) }

// outcome is what a client saw of one request through the gateway.
type outcome struct {
	code     int
	endpoint string // x-devgateway-endpoint: the pod that served it
	pool     string // x-devgateway-pool
	attempts string // x-devgateway-extproc-attempts (set when the picker was retried)
	picker   string // x-devgateway-picker: the picker replica (ip:port) that decided
	body     string
	err      error
	at       time.Time
}

func (o outcome) ok() bool { return o.err == nil && o.code == http.StatusOK }

func (o outcome) String() string {
	if o.err != nil {
		return "error: " + o.err.Error()
	}
	return fmt.Sprintf("%d from %s (%s): %.200s", o.code, o.endpoint, o.pool, o.body)
}

// send sends one request through the gateway with the given Host.
func send(ctx context.Context, host, path, body string, hdr map[string]string) outcome {
	method := http.MethodPost
	if body == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, method, stack.GatewayURL+path, strings.NewReader(body))
	if err != nil {
		return outcome{err: err}
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return outcome{err: err, at: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return outcome{code: resp.StatusCode, endpoint: resp.Header.Get(devgateway.HeaderServedEndpoint), pool: resp.Header.Get(devgateway.HeaderPool),
		attempts: resp.Header.Get(devgateway.HeaderExtProcAttempts), picker: resp.Header.Get(devgateway.HeaderPicker),
		body: string(b), err: err, at: time.Now()}
}

func completion(model, prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

// load keeps workers sending requests until stopped.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    []outcome
}

// startLoad runs workers that each send next(worker, i) in a loop.
func startLoad(workers int, next func(worker, i int) (host, body string)) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				host, body := next(w, i)
				// Each request runs to its end: stopping the load must not
				// turn requests in flight into failures.
				o := send(context.Background(), host, "/v1/completions", body, nil)
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *load) snapshot() []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outcome(nil), l.out...)
}

// waitFor blocks until at least n more requests have completed.
func (l *load) waitFor(t *testing.T, n int) {
	t.Helper()
	start := len(l.snapshot())
	eventually(t, fmt.Sprintf("%d more requests", n), func() bool { return len(l.snapshot()) >= start+n })
}

func (l *load) stop() []outcome {
	l.cancel()
	l.wg.Wait()
	return l.snapshot()
}

func failures(out []outcome) []outcome {
	var bad []outcome
	for _, o := range out {
		if !o.ok() {
			bad = append(bad, o)
		}
	}
	return bad
}

// nothingLost fails t unless every request of out (sent across what)
// succeeded, none gave up on the picker, and every gateway outage since
// before ended within the retry window. It returns the gateway's stats and
// those outages.
func nothingLost(t *testing.T, what string, out []outcome, before devgateway.Stats) (devgateway.Stats, []devgateway.Outage) {
	t.Helper()
	if bad := failures(out); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed across %s, first: %v", len(bad), len(out), what, bad[0])
	}
	after := stack.Gateway.Stats()
	if after.ExtProcGaveUp != before.ExtProcGaveUp {
		t.Fatalf("%d requests gave up on the picker across %s", after.ExtProcGaveUp-before.ExtProcGaveUp, what)
	}
	outages := after.Outages[len(before.Outages):]
	for _, o := range outages {
		if o.End.IsZero() || o.Duration() > retryWindow {
			t.Fatalf("outage %+v across %s open or longer than the retry window", o, what)
		}
	}
	return after, outages
}

// eventually polls cond with a deadline, for states nothing signals.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 60*time.Second, what, cond)
}

// pickerMetric reads a gauge of the picker for a pool; ok is false when the
// series is absent.
func pickerMetric(t *testing.T, name string, pool types.NamespacedName) (float64, bool) {
	t.Helper()
	var val float64
	for i, r := range stack.Replicas() {
		v, ok := replicaMetric(t, r.MetricsAddr, name, pool)
		if !ok || i > 0 && v != val {
			return 0, false
		}
		val = v
	}
	return val, true
}

// pickerMetricMin is the least value of a pool's gauge over the replicas,
// for thresholds on values each replica scrapes at its own instants.
func pickerMetricMin(t *testing.T, name string, pool types.NamespacedName) (float64, bool) {
	t.Helper()
	var least float64
	for i, r := range stack.Replicas() {
		v, ok := replicaMetric(t, r.MetricsAddr, name, pool)
		if !ok {
			return 0, false
		}
		if i == 0 || v < least {
			least = v
		}
	}
	return least, true
}

// replicaMetric reads a pool's gauge from one replica's /metrics.
func replicaMetric(t *testing.T, addr, name string, pool types.NamespacedName) (float64, bool) {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false // a replica restarting
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse picker metrics: %v", err)
	}
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == pool.Namespace && labels["name"] == pool.Name {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// testPool is a namespace with a model-server Deployment, an InferencePool
// selecting it with its own picker Service, and an HTTPRoute for host
// NAME.e2e.example attached to the samples' Gateway.
type testPool struct {
	ns, name, host string
	deploy         types.NamespacedName
}

func (p testPool) key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.ns, Name: p.name}
}

func (p testPool) pods() []*localstack.Pod { return stack.Pods(p.deploy) }

var poolManifest = `apiVersion: v1
kind: Namespace
metadata:
  name: {{ns}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  labels:
    poolpicker.io/picker: poolpicker # opts in to the poolpicker deployment of that name
  name: {{name}}
  namespace: {{ns}}
spec:
  selector:
    matchLabels:
      app: {{name}}-v1
  targetPorts:
  - number: 8000
  endpointPickerRef:
    name: epp-{{name}}
    port:
      number: 9002
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {{name}}
  namespace: {{ns}}
spec:
  parentRefs:
  - name: inference-gateway
    namespace: default
  hostnames:
  - {{name}}.e2e.example
  rules:
  - backendRefs:
    - group: inference.networking.k8s.io
      kind: InferencePool
      name: {{name}}
`

var deploymentManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{deploy}}
  namespace: {{ns}}
spec:
  replicas: {{replicas}}
  selector:
    matchLabels:
      app: {{deploy}}
  template:
    metadata:
      labels:
        app: {{deploy}}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:latest
        args: [{{args}}]
`

func fill(tmpl string, kv ...string) []byte {
	r := strings.NewReplacer(kv...)
	return []byte(r.Replace(tmpl))
}

// newPool creates a pool whose selector matches Deployment NAME-v1, runs
// that Deployment with the given replicas and model-server args, and waits
// until the pool answers through the gateway.
func newPool(t *testing.T, name string, replicas int, args ...string) testPool {
	t.Helper()
	ctx := context.Background()
	p := testPool{ns: "e2e-" + name, name: name, host: name + ".e2e.example", deploy: types.NamespacedName{Namespace: "e2e-" + name, Name: name + "-v1"}}
	if err := stack.Apply(ctx, fill(poolManifest, "{{ns}}", p.ns, "{{name}}", name)); err != nil {
		t.Fatal(err)
	}
	addDeployment(t, p.ns, p.deploy.Name, replicas, args...)
	eventually(t, "pool "+p.key().String()+" serving", func() bool {
		return send(ctx, p.host, "/v1/completions", completion(modelsim.DefaultModel, "ping", 1, false), nil).ok()
	})
	return p
}

func addDeployment(t *testing.T, ns, name string, replicas int, args ...string) {
	t.Helper()
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	m := fill(deploymentManifest, "{{ns}}", ns, "{{deploy}}", name, "{{replicas}}", fmt.Sprint(replicas), "{{args}}", strings.Join(quoted, ", "))
	if err := stack.Apply(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// drain reads a response to its end (or until its request is cancelled).
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// withPickerArgs restarts the replicas (rolling, as RestartPicker) with
// args added to their flags, and restarts them with their own flags again
// when the test ends.
func withPickerArgs(t *testing.T, args ...string) {
	t.Helper()
	ctx := context.Background()
	var saved [][]string
	for _, r := range stack.Replicas() {
		saved = append(saved, r.Process.Args)
		r.Process.Args = append(slices.Clone(r.Process.Args), args...)
	}
	if err := stack.RestartPicker(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i, r := range stack.Replicas() {
			r.Process.Args = saved[i]
		}
		if err := stack.RestartPicker(ctx); err != nil {
			t.Errorf("restarting the replicas with their own flags: %v", err)
		}
	})
}
