// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// The reference EPP router runs the Inference Extension's own endpoint
// picker (cmd/epp, built by `make reference-epp` into bin/, never a
// dependency of any poolpicker module) as a process against a real API
// server: one InferencePool of the fleet's servers, their Pods Ready with
// the servers' loopback IPs, the pool's objectives as InferenceObjectives.
// It runs with its defaults (its default EndpointPickerConfig: queue 2,
// KV-cache use 2, approximate prefix cache 3, max-score picker; ext_proc
// over TLS with a self-signed certificate), save what a benchmark must set:
// its ports, no tracing exporter, no metrics-endpoint authentication, and
// its scrape interval and staleness threshold (50 ms and 2 s) in simulated
// time, as every interval of the sweep is. The traffic is the same as
// poolpicker's: fleet.send on a TLS connection to its gRPC port.
const referenceRouterName = "reference-epp"

var referenceRouter = router{name: referenceRouterName, replicas: []int{1}, external: &referenceEPP}

// externalEPP is an endpoint picker the harness runs as its own process
// against the control plane instead of poolpicker: the reference EPP, or
// llm-d's (llmdepp.go), both started the way the Inference Extension's
// EPP is.
type externalEPP struct {
	// binary is the path the binary's flag sets.
	binary *string
	// flag names that flag, build says how to build the binary.
	flag, build string
	// args are the flags it runs with beyond the common ones (nil: none),
	// for a fleet whose KV events (if the router asks for them) reach the
	// picker at kvEvents.
	args func(c *sweepConfig, f *fleet) []string
	// kvEvents: the servers publish their KV-cache events to the picker.
	kvEvents bool
}

var referenceEPP = externalEPP{binary: &referenceBinary, flag: "-reference-epp", build: "build it with `make reference-epp`"}

// Flags of the reference EPP's defaults that the fleet scales to simulated
// time (its --refresh-metrics-interval and --metrics-staleness-threshold).
const (
	referenceRefreshInterval    = 50 * time.Millisecond
	referenceStalenessThreshold = 2 * time.Second
)

// referenceBinary is the reference EPP's binary (-reference-epp).
var referenceBinary string

// defaultReferenceBinary is bin/epp at the repository root, where `make
// reference-epp` puts it ("" when the root is not found).
func defaultReferenceBinary() string {
	root, err := testenv.RepoRoot()
	if err != nil {
		return ""
	}
	return filepath.Join(root, "bin", "epp")
}

// referenceMissing says why the reference EPP cannot run ("" when it can).
func referenceMissing() string { return referenceEPP.missing() }

// missing says why the external EPP cannot run ("" when it can): no
// binary, or no control plane to run it against.
func (x *externalEPP) missing() string {
	if *x.binary == "" {
		return fmt.Sprintf("no binary given (%s)", x.flag)
	}
	if _, err := os.Stat(*x.binary); err != nil {
		return fmt.Sprintf("%s not found: %s", *x.binary, x.build)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err.Error()
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(testenv.AssetsDir(root), b)); err != nil {
			return fmt.Sprintf("%s not found in %s: run `make control-plane` (or set KUBEBUILDER_ASSETS)", b, testenv.AssetsDir(root))
		}
	}
	return ""
}

// dropReference removes the external EPP routers from routers when they
// cannot run, saying why on w.
func dropReference(routers []router, w io.Writer) []router {
	out := routers[:0:0]
	for _, r := range routers {
		if r.external != nil {
			if why := r.external.missing(); why != "" {
				fmt.Fprintf(w, "%s: skipped: %s\n", r.name, why)
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// controlPlane is the API server the reference EPP processes of a sweep
// share (each fleet in its own namespace), started at the first use.
var controlPlane struct {
	mu   sync.Mutex
	env  *testenv.Env
	dir  string // kubeconfig and logs
	next atomic.Int64
}

// sharedControlPlane starts the control plane once.
func sharedControlPlane() (*testenv.Env, string, error) {
	controlPlane.mu.Lock()
	defer controlPlane.mu.Unlock()
	if controlPlane.env != nil {
		return controlPlane.env, controlPlane.dir, nil
	}
	dir, err := os.MkdirTemp("", "routing-reference-")
	if err != nil {
		return nil, "", err
	}
	// The API server's client logs nothing the harness reports; unset,
	// controller-runtime prints a stack to say so.
	ctrllog.SetLogger(logr.Discard())
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	if err := testenv.WriteKubeconfig(env.Config, filepath.Join(dir, "kubeconfig")); err != nil {
		_ = env.Stop()
		os.RemoveAll(dir)
		return nil, "", err
	}
	controlPlane.env, controlPlane.dir = env, dir
	return env, dir, nil
}

// stopControlPlane stops the shared control plane, if one was started, and
// removes its files (the reference EPPs' logs with them).
func stopControlPlane() {
	controlPlane.mu.Lock()
	defer controlPlane.mu.Unlock()
	if controlPlane.env == nil {
		return
	}
	_ = controlPlane.env.Stop()
	os.RemoveAll(controlPlane.dir)
	controlPlane.env, controlPlane.dir = nil, ""
}

// startReference starts the external EPP x in front of fleet f's (number
// n) servers (pods, on port) and returns it as the fleet's one replica
// once it is ready and lists every pod as ready.
func startReference(ctx context.Context, n int, cfg *sweepConfig, x *externalEPP, f *fleet, port int, pods []datastore.EndpointSource) (_ *replica, _ func(), err error) {
	env, dir, err := sharedControlPlane()
	if err != nil {
		return nil, nil, err
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	ns := fmt.Sprintf("routing-%d-%d", n, controlPlane.next.Add(1))
	c := env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}, Spec: v1.InferencePoolSpec{
		Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "bench"}},
		TargetPorts:       []v1.Port{{Number: v1.PortNumber(port)}},
		EndpointPickerRef: &v1.EndpointPickerRef{Name: pickerService, Port: &v1.Port{Number: pickerPort}},
	}}
	if err := c.Create(ctx, pool); err != nil {
		return nil, nil, err
	}
	for name, prio := range map[string]int{objectiveCritical: 0, objectiveSheddable: -1} {
		o := &v1alpha2.InferenceObjective{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha2.InferenceObjectiveSpec{Priority: &prio, PoolRef: v1alpha2.PoolObjectReference{Name: "pool"}}}
		if err := c.Create(ctx, o); err != nil {
			return nil, nil, err
		}
	}
	for _, p := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Pod.Name, Labels: map[string]string{"app": "bench"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Image: "modelsim"}}},
		}
		if err := c.Create(ctx, pod); err != nil {
			return nil, nil, err
		}
		now := metav1.Now()
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.IP, PodIPs: []corev1.PodIP{{IP: p.IP}}, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}}
		if err := c.Status().Update(ctx, pod); err != nil {
			return nil, nil, err
		}
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, nil, err
	}
	grpcPort, healthPort, metricsPort := ports[0], ports[1], ports[2]
	logPath := filepath.Join(dir, ns+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, err
	}
	args := []string{"--pool-name", "pool", "--pool-namespace", ns,
		"--grpc-port", strconv.Itoa(grpcPort), "--grpc-health-port", strconv.Itoa(healthPort), "--metrics-port", strconv.Itoa(metricsPort),
		"--tracing=false", "--metrics-endpoint-auth=false",
		"--refresh-metrics-interval", scaled(referenceRefreshInterval, cfg.timeScale).String(),
		"--metrics-staleness-threshold", scaled(referenceStalenessThreshold, cfg.timeScale).String()}
	if x.args != nil {
		args = append(args, x.args(cfg, f)...)
	}
	cmd := exec.Command(*x.binary, args...)
	// controller-runtime's config loader reads KUBECONFIG; the binary has
	// no --kubeconfig flag.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "kubeconfig"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// It dies with the harness: a killed sweep leaves no picker behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("%s: %w", *x.binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	stops = append(stops, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	if err := waitServing(ctx, fmt.Sprintf("127.0.0.1:%d", healthPort), exited); err != nil {
		return nil, nil, fmt.Errorf("%s: %w\n--- %s ---\n%s", *x.binary, err, logPath, tailFile(logPath, 30))
	}
	if err := waitReadyPods(ctx, metricsPort, len(pods)); err != nil {
		return nil, nil, fmt.Errorf("%s: %w\n--- %s ---\n%s", *x.binary, err, logPath, tailFile(logPath, 30))
	}
	// Its ext_proc server serves TLS with a self-signed certificate by
	// default (--secure-serving), as a gateway reaches it.
	rp := &replica{client: eppclient.New(fmt.Sprintf("127.0.0.1:%d", grpcPort), eppclient.Options{TLS: true}),
		authority: fmt.Sprintf("%s.%s.svc:%d", pickerService, ns, pickerPort)}
	stops = append(stops, func() { _ = rp.client.Close() })
	return rp, stop, nil
}

// waitServing waits until the gRPC health service "readiness" at addr (the
// reference EPP's health port, plaintext) reports SERVING, or the process
// exits.
func waitServing(ctx context.Context, addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	var last error
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		ccancel()
		switch {
		case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return nil
		case err == nil:
			last = fmt.Errorf("readiness %s", resp.GetStatus())
		default:
			last = err
		}
		// Readiness is not pushed: poll, backing off.
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready within 2 minutes: %w", last)
		case <-time.After(wait):
		}
	}
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 at the time of
// the call.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitReadyPods waits until the reference EPP's own gauge of the pool's
// ready pods (inference_pool_ready_pods) says want. Its metrics reach the
// scheduler within a scrape interval of that, inside the run's warm-up.
func waitReadyPods(ctx context.Context, metricsPort, want int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	var last string
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if got, err := readyPods(ctx, url); err != nil {
			last = err.Error()
		} else if got == want {
			return nil
		} else {
			last = fmt.Sprintf("inference_pool_ready_pods %d", got)
		}
		// Nothing signals the gauge: poll, backing off.
		select {
		case <-ctx.Done():
			return fmt.Errorf("not %d ready pods within a minute (last: %s)", want, last)
		case <-time.After(wait):
		}
	}
}

// readyPods reads inference_pool_ready_pods from the metrics page at url.
func readyPods(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "inference_pool_ready_pods{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", line, err)
		}
		return int(v), nil
	}
	return 0, errors.New("no inference_pool_ready_pods series yet")
}

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
