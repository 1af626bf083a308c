// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
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
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/poolpicker/poolpicker/internal/testenv"
)

// buildPicker builds cmd/poolpicker into a temporary directory.
func buildPicker(ctx context.Context) (string, func(), error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "scale-bin")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "poolpicker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/poolpicker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building poolpicker: %w: %s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// picker is a running poolpicker binary.
type picker struct {
	cmd                       *exec.Cmd
	grpcAddr, health, metrics string
	started                   time.Time
	log                       *tailWriter
	exited                    chan struct{}
}

// freePort is a port free on every address (the model servers listen on
// the loopback device's wildcard address).
func freePort() (int, error) {
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startPicker runs the binary with its default flags, bar the kubeconfig,
// ports, the plan and -picker-args; /metrics is served without
// authentication so that the harness reads it without TokenReviews, which
// would count as poolpicker's API requests.
func startPicker(ctx context.Context, bin, kubeconfig string, c config) (*picker, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	args := []string{"--kubeconfig", kubeconfig, "--grpc-port", strconv.Itoa(ports[0]),
		"--grpc-health-port", strconv.Itoa(ports[1]), "--metrics-port", strconv.Itoa(ports[2]), "--metrics-endpoint-auth=false"}
	if c.Plan != "" {
		args = append(args, "--pod-watch-plan", c.Plan)
	}
	args = append(args, strings.Fields(c.PickerArgs)...)
	p := &picker{
		grpcAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		health:   net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		metrics:  fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2]),
		log:      &tailWriter{max: 64 << 10},
		exited:   make(chan struct{}),
	}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stderr = p.log
	if c.logPicker {
		p.cmd.Stderr = io.MultiWriter(os.Stderr, p.log)
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *picker) pid() int { return p.cmd.Process.Pid }

// waitReady polls the readiness health service until it is SERVING: the
// pool controller's initial sync (every pool's pods listed).
func (p *picker) waitReady(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	conn, err := grpc.NewClient(p.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return time.Since(p.started), nil
		}
		select {
		case <-p.exited:
			return 0, fmt.Errorf("poolpicker exited before it was ready: %s", p.log)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("poolpicker not ready after %s", timeout)
		}
	}
}

// pickerMetrics are the figures read from poolpicker's /metrics.
type pickerMetrics struct {
	requests   float64 // rest_client_requests_total, every attempt
	byMethod   map[string]float64
	heapInuse  float64
	goroutines float64
	// timeouts are the scrapes that timed out, of every pool.
	timeouts float64
	// busyInterval is the longest interval the scrape budget allows a busy
	// pool's servers, perScrape the scrapes' mean CPU cost (seconds).
	busyInterval, perScrape float64
}

func (p *picker) readMetrics(ctx context.Context) (pickerMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metrics, nil)
	if err != nil {
		return pickerMetrics{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return pickerMetrics{}, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return pickerMetrics{}, err
	}
	m := pickerMetrics{byMethod: map[string]float64{}}
	if f := fams["rest_client_requests_total"]; f != nil {
		for _, s := range f.GetMetric() {
			v := s.GetCounter().GetValue()
			m.requests += v
			m.byMethod[label(s, "method")] += v
		}
	}
	if f := fams["inference_pool_metrics_scrape_errors_total"]; f != nil {
		for _, s := range f.GetMetric() {
			if label(s, "reason") == "timeout" {
				m.timeouts += s.GetCounter().GetValue()
			}
		}
	}
	m.busyInterval = gauge(fams["poolpicker_scrape_budget_busy_interval_max_seconds"])
	m.perScrape = gauge(fams["poolpicker_scrape_budget_cpu_per_scrape_seconds"])
	m.heapInuse = gauge(fams["go_memstats_heap_inuse_bytes"])
	m.goroutines = gauge(fams["go_goroutines"])
	return m, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func gauge(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

// saveProfile writes poolpicker's pprof profile name (with query, e.g.
// "profile?seconds=5") to path.
func (p *picker) saveProfile(ctx context.Context, name, path string) error {
	url := strings.TrimSuffix(p.metrics, "/metrics") + "/debug/pprof/" + name
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// saveProfileFromStart is saveProfile as soon as poolpicker's metrics
// server listens.
func (p *picker) saveProfileFromStart(ctx context.Context, name, path string) error {
	for {
		err := p.saveProfile(ctx, name, path)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		select {
		case <-p.exited:
			return fmt.Errorf("poolpicker exited: %s", p.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *picker) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// tailWriter keeps the last max bytes written, and the lines about the
// scrape budget (budgetLogMark) with when they came.
type tailWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	max     int
	partial []byte
	budget  []budgetLine
}

// budgetLogMark is in each of poolpicker's log lines about the scrape
// budget trading freshness.
const budgetLogMark = "metrics scrape budget"

// budgetLine is a log line about the scrape budget.
type budgetLine struct {
	at   time.Time
	line string
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if over := w.buf.Len() - w.max; over > 0 {
		w.buf.Next(over)
	}
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		if line := w.partial[:i]; bytes.Contains(line, []byte(budgetLogMark)) && len(w.budget) < 1000 {
			w.budget = append(w.budget, budgetLine{at: time.Now(), line: string(line)})
		}
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > w.max {
		w.partial = w.partial[:0] // a line that long is no budget line
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// budgetSince returns the budget lines logged since t, each prefixed with
// its time from origin.
func (w *tailWriter) budgetSince(t, origin time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.budget {
		if !l.at.Before(t) {
			out = append(out, fmt.Sprintf("%+.1fs: %s", l.at.Sub(origin).Seconds(), l.line))
		}
	}
	return out
}

var _ io.Writer = (*tailWriter)(nil)
