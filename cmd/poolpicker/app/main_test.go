// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var (
	env        *testenv.Env
	binary     string
	kubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "poolpicker-main")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "poolpicker")
		// The command is cmd/poolpicker, this package's one caller.
		if out, err := exec.Command("go", "build", "-o", binary, "..").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building poolpicker: %v\n%s", err, out)
			return 1
		}
		kubeconfig = filepath.Join(dir, "kubeconfig")
		return testenv.RunMain(m, &env, testenv.Options{})
	}())
}

func writeKubeconfig(t *testing.T) {
	t.Helper()
	if err := testenv.WriteKubeconfig(env.Config, kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// TestBadFlagsExitNonZero runs the built binary with bad flags: each must
// exit with the usage code and say what is wrong, before touching a cluster.
func TestBadFlagsExitNonZero(t *testing.T) {
	cases := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{[]string{"--grpc-port=abc"}, 2, `invalid argument "abc" for "--grpc-port"`},
		{[]string{"--no-such-flag"}, 2, "unknown flag: --no-such-flag"},
		{[]string{"--pool-selector=shard in (a"}, 2, `pool selector "shard in (a"`},
		{[]string{"--pool-namespace=serving"}, 2, "pool namespace is set without a pool name"},
		{[]string{"--watch-namespaces=Bad_NS"}, 2, `watch namespace "Bad_NS" is not a valid namespace name`},
		{[]string{"--epp-service-name=epp.default"}, 2, `endpoint picker Service name "epp.default"`},
		{[]string{"--metrics-port=70000"}, 2, "--metrics-port 70000: must be 1..65535"},
		{[]string{"--metrics-port=9002"}, 2, "must differ"},
		{[]string{"-v=lots"}, 2, `invalid argument "lots" for "-v, --v"`},
		{[]string{"stray"}, 2, `unexpected arguments ["stray"]`},
		{[]string{"--config-text=apiVersion: nope"}, 2, "scheduler"},
		{[]string{"--ha-leader-election-lease-duration=5s", "--ha-leader-election-renew-deadline=6s"}, 2, "renew deadline 6s must be shorter than the lease duration 5s"},
		{[]string{"--picker-pod-selector=app in (x"}, 2, `picker pod selector "app in (x"`},
		{[]string{"--picker-name=Bad_Name"}, 2, `picker name "Bad_Name"`},
		{[]string{"--pod-watch-plan=per-namespace"}, 2, `invalid argument "per-namespace" for "--pod-watch-plan" flag: must be one of auto, per-pool, namespace`},
		{[]string{"--pod-watch-namespace-threshold=-1"}, 2, "namespace watch threshold -1: must not be negative"},
		{[]string{"--total-queued-requests-metric=q{a!=b}"}, 2, `metric selector "q{a!=b}": label a: want label=value`},
		{[]string{"--kubeconfig=/nonexistent/kubeconfig"}, 1, `loading the API server configuration (--kubeconfig "/nonexistent/kubeconfig")`},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, tc.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			if err == nil || code != tc.wantCode {
				t.Fatalf("exit code %d (%v), want %d; stderr:\n%s", code, err, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Fatalf("stderr does not say %q:\n%s", tc.wantErr, stderr.String())
			}
		})
	}
	out, err := exec.Command(binary, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, flag := range []string{"--kubeconfig", "--grpc-port", "--grpc-health-port", "--metrics-port", "-v, --v", "--watch-namespaces", "--pool-selector", "--pool-name", "--pool-namespace", "--epp-service-name", "--ha-enable-leader-election", "--provision-picker-services", "--drain-grace-period", "--drain-timeout"} {
		if !strings.Contains(string(out), flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := localstack.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// servePool makes a namespace with one pool and one ready pod.
func servePool(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := env.Namespace(t, "main")
	readyPod(t, ns, "server", "127.0.0.2", map[string]string{"app": "m"})
	// The label opts the pool in to the default deployment.
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool", Labels: map[string]string{"poolpicker.io/picker": "poolpicker"}}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: 8000}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return ns
}

// waitMetrics polls /metrics (a process exposes no event to wait on) until
// every line in want is on the page.
func waitMetrics(t *testing.T, port int, want ...string) string {
	t.Helper()
	var page string
	defer func() {
		if t.Failed() {
			t.Logf("last /metrics page:\n%s", page)
		}
	}()
	poll.Until(t, 60*time.Second, fmt.Sprintf("/metrics to show %q", want), func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page = string(b)
		for _, w := range want {
			if !strings.Contains(page, w) {
				return false
			}
		}
		return true
	})
	return page
}

// startBinary runs the built binary with args and env (nil: this process's)
// until the test ends; exited is closed when it exits.
func startBinary(t *testing.T, args, env []string) (exited <-chan struct{}, stderr *syncBuffer) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	stderr = &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return done, stderr
}

func pickerArgs(ns string, ports []int) []string {
	return []string{"--kubeconfig=" + kubeconfig, "--watch-namespaces=" + ns, "--secure-serving=false", "--metrics-endpoint-auth=false",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]), "-v=2"}
}

// TestBinaryServesAndStopsOnSIGTERM runs the built binary against the API
// server until it serves a pool, then sends SIGTERM: it must exit 0.
func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	writeKubeconfig(t)
	ns := servePool(t)
	ports := freePorts(t, 3)
	cmd := exec.Command(binary, pickerArgs(ns, ports)...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	page := waitMetrics(t, ports[2],
		fmt.Sprintf(`inference_pool_ready_pods{name="pool",namespace="%s"} 1`, ns),
		"poolpicker_served_pools 1",
		fmt.Sprintf(`poolpicker_pool_watch_starts_total{name="pool",namespace="%s"} 1`, ns),
		"process_resident_memory_bytes", "controller_runtime_reconcile_total")
	if !strings.Contains(page, "inference_objective_request") && !strings.Contains(page, "scrape") {
		t.Logf("note: no ext_proc or scrape series yet (they appear on first use)")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("still running 45s after SIGTERM; stderr:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"stopped"`) && !strings.Contains(stderr.String(), "stopped") {
		t.Errorf("no clean-stop log line; stderr:\n%s", stderr.String())
	}
}

// TestRunEndsEveryGoroutine runs the whole wiring in-process and cancels it:
// every goroutine started must end.
func TestRunEndsEveryGoroutine(t *testing.T) {
	writeKubeconfig(t)
	ns := servePool(t)
	ports := freePorts(t, 3)
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() { done <- NewCommand().Run(ctx, pickerArgs(ns, ports), &stderr) }()
	waitMetrics(t, ports[2], fmt.Sprintf(`inference_pool_ready_pods{name="pool",namespace="%s"} 1`, ns))
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run returned %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	goleak.VerifyNone(t, before,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Each scrape poller gets a P of its own beside the request path's, unless
// the operator set GOMAXPROCS.
func TestScrapePollersGetTheirOwnP(t *testing.T) {
	writeKubeconfig(t)
	ns := servePool(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			env = append(env, kv)
		}
	}
	for _, tt := range []struct {
		name string
		env  []string
		want int
	}{
		{"default", env, defaultProcs + 1},
		{"operator's GOMAXPROCS", append(slices.Clone(env), "GOMAXPROCS=5"), 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ports := freePorts(t, 3)
			startBinary(t, append(pickerArgs(ns, ports), "--metrics-scrape-cpu-budget=1"), tt.env)
			waitMetrics(t, ports[2], fmt.Sprintf("\ngo_sched_gomaxprocs_threads %d\n", tt.want))
		})
	}
}
