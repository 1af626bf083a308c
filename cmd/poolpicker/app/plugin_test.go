// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// TestWithPlugin runs testdata/withplugin, poolpicker built with a plugin
// of its own added by WithPlugin, written against the framework only and
// named in the config file: the plugin is called, its views follow the
// model server's live queue through the scraper (3 waiting, then 7), its
// metrics registered through its handle are served, its handle's logger
// logs, and the binary stops cleanly.
func TestWithPlugin(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "withplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/withplugin").CombinedOutput(); err != nil {
		t.Fatalf("building testdata/withplugin: %v\n%s", err, out)
	}
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
	if err := os.WriteFile(config, []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: view-recorder\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ports := freePorts(t, 3)
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--pool-name=pool", "--pool-namespace="+ns, "--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false",
		"--config-file="+config, fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := eppclient.WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", ports[1]), "readiness"); err != nil {
		t.Fatalf("readiness: %v; stderr:\n%s", err, stderr.String())
	}
	client := eppclient.New(fmt.Sprintf("127.0.0.1:%d", ports[0]), eppclient.Options{})
	defer client.Close()
	endpoint := net.JoinHostPort(ip, fmt.Sprint(port))
	// Picks until the plugin's view shows the server's queue at want: the
	// first request after an idle spell has the scraper refresh the pool.
	seeWaiting := func(want int) {
		t.Helper()
		series := fmt.Sprintf("test_view_recorder_waiting{endpoint=%q} %d\n", endpoint, want)
		poll.Until(t, time.Minute, "the plugin's view to report "+strings.TrimSpace(series), func() bool {
			res, err := client.Do(ctx, eppclient.Request{Shape: eppclient.FullDuplex, Body: []byte(`{"model":"m","prompt":"hi"}`)})
			if err != nil {
				t.Fatalf("request: %v; stderr:\n%s", err, stderr.String())
			}
			if got := res.Endpoints(); len(got) == 0 || got[0] != endpoint {
				t.Fatalf("picked %v, want %s", got, endpoint)
			}
			return strings.Contains(metricsPage(t, ports[2]), series)
		})
	}
	seeWaiting(3)
	waiting.Store(7)
	seeWaiting(7)
	if page := metricsPage(t, ports[2]); !strings.Contains(page, fmt.Sprintf("test_view_recorder_picks_total{primary=%q}", endpoint)) {
		t.Fatalf("no picks of %s counted by the plugin's PostPick", endpoint)
	}
	if !strings.Contains(stderr.String(), "view-recorder built") {
		t.Errorf("the plugin's handle logger logged nothing; stderr:\n%s", stderr.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("still running 45s after SIGTERM; stderr:\n%s", stderr.String())
	}
}

// metricsPage is the picker's /metrics page now.
func metricsPage(t *testing.T, port int) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWithPluginTypeTaken: a plugin type added twice, or one a built-in
// plugin has, stops the command before anything starts, naming the type.
func TestWithPluginTypeTaken(t *testing.T) {
	f := func(string, json.RawMessage, framework.Handle) (framework.Plugin, error) { return nil, nil }
	for name, opts := range map[string][]Option{
		"twice":    {WithPlugin("mine", f), WithPlugin("mine", f)},
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
