// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/scrape"
)

// readyPod creates a running, ready pod with the IP and labels.
func readyPod(t *testing.T, ns, name, ip string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "vllm"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// serveMetricsPage serves page at every path of ip (port chosen by the
// first listener, 0) until the test ends, and returns the port.
func serveMetricsPage(t *testing.T, ip string, port int, page []byte) int {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) }), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().(*net.TCPAddr).Port
}

// TestUpstreamEngineLabel runs the binary against the API server and two
// model servers of engines other than the default, each pod naming its
// engine with the upstream label inference.networking.k8s.io/engine-type:
// both are read with their engine's metric names (the default engine's
// would find none of them on these pages).
func TestUpstreamEngineLabel(t *testing.T) {
	writeKubeconfig(t)
	ns := env.Namespace(t, "engine")
	port := 0
	for i, engine := range []string{"sglang", "triton-tensorrt-llm"} {
		page, err := os.ReadFile(filepath.Join("..", "..", "..", "scrape", "testdata", engine+".metrics"))
		if err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("127.0.16.%d", 2+i)
		port = serveMetricsPage(t, ip, port, page)
		readyPod(t, ns, engine, ip, map[string]string{"app": "m", scrape.LabelEngineType: engine})
	}
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(port)}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}

	ports := freePorts(t, 3)
	exited, stderr := startBinary(t, []string{"--kubeconfig=" + kubeconfig, "--pool-name=pool", "--pool-namespace=" + ns, "--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}, nil)
	waitHealthServing(t, ports[1], exited, stderr, "readiness")
	// Each fixture reports 3 queued requests and 5 running, a quarter of the
	// KV cache used.
	waitMetrics(t, ports[2],
		fmt.Sprintf(`inference_pool_per_pod_queue_size{model_server_pod="sglang-rank-0",name="pool",namespace="%s"} 3`, ns),
		fmt.Sprintf(`inference_pool_per_pod_queue_size{model_server_pod="triton-tensorrt-llm-rank-0",name="pool",namespace="%s"} 3`, ns),
		fmt.Sprintf(`inference_pool_average_running_requests{name="pool",namespace="%s"} 5`, ns),
		fmt.Sprintf(`inference_pool_average_kv_cache_utilization{name="pool",namespace="%s"} 0.25`, ns))
}
