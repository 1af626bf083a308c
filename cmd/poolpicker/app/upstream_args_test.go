// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// upstreamDeployment is how an upstream manifest or chart starts its EPP:
// the container's args and env, and the files its --config-file may name
// (under /config, as the manifests mount them).
type upstreamDeployment struct {
	name string
	args []string
	env  []string
	// configs maps a file under /config to the upstream config (in
	// scheduling/testdata/upstream) it holds.
	configs map[string]string
	// warns are start-up warnings the args must earn (a flag without effect here).
	warns []string
	// refused are TLS client configurations the ext_proc port must refuse
	// in the handshake, accepted one it must accept (nil: not checked).
	refused  []*tls.Config
	accepted *tls.Config
}

// The argument lists below are copied as data from the upstream manifests:
// the Inference Extension v1.5.0 chart (config/charts/epplib), its
// conformance manifests (conformance/resources/base.yaml) and e2e manifest
// (test/testdata/inferencepool-e2e.yaml), and the llm-d router chart
// (config/charts/routerlib; "current" is its templates/_deployment.yaml of
// August 2026, which renders router.epp.flags as --key=value in key order
// between --grpc-health-port and --tracing, and adds --secure-serving=false
// to them for the agentgateway proxy). NS and POOL stand for the pool's
// namespace and name; /config/ for the directory of the configs.
func upstreamDeployments() []upstreamDeployment {
	return []upstreamDeployment{
		{
			name: "inference-extension chart, one replica",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--v", "1", "--tracing=false"},
			configs: map[string]string{"default-plugins.yaml": "inference-extension-chart-default.yaml"},
		},
		{
			name: "inference-extension chart, two replicas, prometheus auth off, tracing on",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--ha-enable-leader-election",
				"--v", "1", "--tracing=true", "--metrics-endpoint-auth=false"},
			// The chart's tracing environment (values.yaml defaults).
			env: []string{"OTEL_SERVICE_NAME=gateway-api-inference-extension/epp", "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317",
				"OTEL_TRACES_EXPORTER=otlp", "OTEL_RESOURCE_ATTRIBUTES=k8s.namespace.name=NS,k8s.node.name=node-1,k8s.pod.name=epp-0",
				"OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.1"},
			configs: map[string]string{"default-plugins.yaml": "inference-extension-chart-default.yaml"},
			warns:   []string{`"tracing on"`, `"exporter":"otlp"`, `"sampler":"parentbased_traceidratio(0.1)"`},
		},
		{
			name: "inference-extension chart, sglang model servers",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				`--total-queued-requests-metric="sglang:num_queue_reqs"`, `--total-running-requests-metric="sglang:num_running_reqs"`,
				`--kv-cache-usage-percentage-metric="sglang:token_usage"`, `--cache-info-metric="sglang:cache_config_info"`,
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--v", "1", "--tracing=false"},
			configs: map[string]string{"default-plugins.yaml": "inference-extension-chart-default.yaml"},
		},
		{
			name: "conformance manifests",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--v", "4", "--zap-encoder", "json",
				"--grpc-port", "9002", "--grpc-health-port", "9003", "--config-file", "/config/conformance-plugins.yaml"},
			configs: map[string]string{"conformance-plugins.yaml": "conformance-plugins.yaml"},
			warns:   []string{"conformance-test behaviours are on"},
		},
		{
			name: "inference-extension e2e manifest, namespace from NAMESPACE",
			args: []string{"--pool-name", "POOL", "--v", "4", "--zap-encoder", "json", "--grpc-port", "9002",
				"--grpc-health-port", "9003", "--config-file", "/config/default-plugins.yaml"},
			env:     []string{"NAMESPACE=NS"},
			configs: map[string]string{"default-plugins.yaml": "inference-extension-chart-default.yaml"},
		},
		{
			name: "llm-d router chart, agentgateway proxy, priority routing",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--grpc-health-port", "9003",
				"--health-checking=true", "--secure-serving=false", "--drain-timeout=10s", "--grpc-max-recv-msg-size=20MiB",
				"--enable-grpc-stream-metrics=true", "--tracing=false", "--metrics-endpoint-auth=false"},
			configs: map[string]string{"default-plugins.yaml": "llm-d-router-chart-default.yaml"},
			warns:   []string{"--enable-grpc-stream-metrics=true has no effect"},
		},
		{
			name: "llm-d router chart (current), one replica, defaults",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--grpc-health-port", "9003", "--tracing=false"},
			env:     []string{"NAMESPACE=NS", "POD_NAME=epp-0"},
			configs: map[string]string{"default-plugins.yaml": "llm-d-router-chart-default.yaml"},
			// Secure serving with a self-signed certificate: TLS 1.2 and up.
			refused:  []*tls.Config{{MaxVersion: tls.VersionTLS11}},
			accepted: &tls.Config{MaxVersion: tls.VersionTLS12},
		},
		{
			name: "llm-d router chart (current), two replicas, a TLS profile and endpoint scores in router.epp.flags",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--ha-enable-leader-election", "--grpc-health-port", "9003",
				"--emit-endpoint-scores=true", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
				"--tls-min-version=VersionTLS12", "--v=2", "--tracing=false", "--metrics-endpoint-auth=false"},
			env:     []string{"NAMESPACE=NS", "POD_NAME=epp-0"},
			configs: map[string]string{"default-plugins.yaml": "llm-d-router-chart-default.yaml"},
			refused: []*tls.Config{{MaxVersion: tls.VersionTLS11},
				{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305}}},
			accepted: &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
		},
		{
			name: "llm-d router chart (current), agentgateway proxy, a TLS minimum in router.epp.flags",
			args: []string{"--pool-name", "POOL", "--pool-namespace", "NS", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--grpc-health-port", "9003",
				"--secure-serving=false", "--tls-min-version=VersionTLS13", "--tracing=false"},
			env:     []string{"NAMESPACE=NS", "POD_NAME=epp-0"},
			configs: map[string]string{"default-plugins.yaml": "llm-d-router-chart-default.yaml"},
			warns:   []string{"--tls-min-version=VersionTLS13 has no effect: ext_proc is served in plaintext"},
		},
	}
}

// TestUpstreamArgumentsStart starts the built binary with each upstream
// argument list: it must come up (SERVING on the health services upstream's
// probes ask) and say which flags have no effect.
func TestUpstreamArgumentsStart(t *testing.T) {
	writeKubeconfig(t)
	ns := servePool(t)
	for _, d := range upstreamDeployments() {
		t.Run(d.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, upstream := range d.configs {
				text, err := os.ReadFile(filepath.Join("..", "..", "..", "scheduling", "testdata", "upstream", upstream))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, name), text, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ports := freePorts(t, 3)
			var args []string
			for _, a := range d.args {
				a = strings.ReplaceAll(a, "/config/", dir+"/")
				switch a {
				case "NS":
					a = ns
				case "POOL":
					a = "pool"
				}
				args = append(args, a)
			}
			// The manifests' fixed ports would collide between tests; the
			// last occurrence of a flag wins.
			args = append(args, "--kubeconfig="+kubeconfig, fmt.Sprintf("--grpc-port=%d", ports[0]),
				fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]))
			var env []string
			for _, e := range d.env {
				env = append(env, strings.ReplaceAll(e, "=NS", "="+ns))
			}
			exited, stderr := startBinary(t, args, append(env, "PATH="+os.Getenv("PATH")))
			waitHealthServing(t, ports[1], exited, stderr, "inference-extension", "readiness", "liveness", "", "envoy.service.ext_proc.v3.ExternalProcessor")
			addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
			for _, cfg := range d.refused {
				if err := tlsHandshake(addr, cfg); err == nil {
					t.Errorf("ext_proc port accepted a TLS client offering %s at most with suites %v", tls.VersionName(cfg.MaxVersion), cfg.CipherSuites)
				}
			}
			if d.accepted != nil {
				if err := tlsHandshake(addr, d.accepted); err != nil {
					t.Errorf("ext_proc port refused a TLS client offering %s with suites %v: %v", tls.VersionName(d.accepted.MaxVersion), d.accepted.CipherSuites, err)
				}
			}
			for _, w := range d.warns {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("no warning %q; stderr:\n%s", w, stderr.String())
				}
			}
			if strings.Contains(strings.Join(d.args, " "), "--zap-encoder json") && !strings.Contains(stderr.String(), `{"level":"info"`) {
				t.Errorf("--zap-encoder json: no JSON log lines; stderr:\n%s", stderr.String())
			}
		})
	}
}

// tlsHandshake completes a TLS handshake with addr as cfg offers it (the
// picker's certificate unverified: it is self-signed).
func tlsHandshake(addr string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	cfg.InsecureSkipVerify, cfg.MinVersion, cfg.NextProtos = true, tls.VersionTLS10, []string{"h2"}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	return c.Close()
}

// waitHealthServing watches each health service (the Watch RPC, waiting
// for the process to listen) until it answers SERVING; it fails at once if
// the process exits.
func waitHealthServing(t *testing.T, port int, exited <-chan struct{}, stderr *syncBuffer, services ...string) {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watched := make(chan struct{})
	defer close(watched)
	go func() {
		select {
		case <-exited:
			cancel()
		case <-watched:
		}
	}()
	for _, svc := range services {
		status, err := watchUntilServing(ctx, hc, svc)
		select {
		case <-exited:
			t.Fatalf("exited before serving; stderr:\n%s", stderr.String())
		default:
		}
		if err != nil {
			t.Fatalf("health service %q not SERVING after 60s (last: %v, %v); stderr:\n%s", svc, status, err, stderr.String())
		}
	}
}

// watchUntilServing returns once the service's status is SERVING, or with
// the last status and the error that ended the watch.
func watchUntilServing(ctx context.Context, hc healthpb.HealthClient, svc string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc}, grpc.WaitForReady(true))
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, err
	}
	last := healthpb.HealthCheckResponse_UNKNOWN
	for last != healthpb.HealthCheckResponse_SERVING {
		resp, err := stream.Recv()
		if err != nil {
			return last, err
		}
		last = resp.GetStatus()
	}
	return last, nil
}
