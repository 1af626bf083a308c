// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/otlptest"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// dashboardMetrics returns the metric families the shipped Grafana dashboard
// queries (histogram series named by their family).
func dashboardMetrics(t *testing.T) (metrics, exprs []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "grafana", "poolpicker.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		exprs = append(exprs, v.Definition)
	}
	if !vars["namespace"] || !vars["pool"] {
		t.Fatalf("dashboard variables %v: want namespace and pool", vars)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	name := regexp.MustCompile(`\b(inference_[a-z0-9_]+|poolpicker_[a-z0-9_]+)`)
	set := map[string]bool{}
	for _, e := range exprs {
		for _, m := range name.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			set[m] = true
		}
	}
	for m := range set {
		metrics = append(metrics, m)
	}
	sort.Strings(metrics)
	return metrics, exprs
}

// selectorLabels maps each metric a dashboard expression selects with label
// matchers (metric{label="..."}) to the label names it matches on.
func selectorLabels(exprs []string) map[string][]string {
	sel := regexp.MustCompile(`\b((?:inference|poolpicker)_[a-z0-9_]+)\{([^}]*)\}`)
	label := regexp.MustCompile(`([a-z_]+)\s*=~?`)
	out := map[string][]string{}
	for _, e := range exprs {
		for _, m := range sel.FindAllStringSubmatch(e, -1) {
			for _, l := range label.FindAllStringSubmatch(m[2], -1) {
				out[m[1]] = append(out[m[1]], l[1])
			}
		}
	}
	return out
}

// TestDashboardMetricsExported runs the built binary against the API
// server and a model server, plays a gateway for a served request and a
// refused one, then scrapes /metrics: every metric the dashboard queries
// must be there.
func TestDashboardMetricsExported(t *testing.T) {
	want, exprs := dashboardMetrics(t)
	if len(want) < 10 {
		t.Fatalf("dashboard queries only %v", want)
	}

	// A model server on its own loopback address, serving a vLLM page.
	page, err := vllmpage.Page(vllmpage.State{Waiting: 1, Running: 2, KVCacheUsage: 0.25, BlockSize: 16, NumGPUBlocks: 1000}, vllmpage.Options{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	msPort := serveMetricsPage(t, "127.0.15.2", 0, page)

	writeKubeconfig(t)
	ctx := context.Background()
	ns := env.Namespace(t, "dashboard")
	readyPod(t, ns, "server", "127.0.15.2", map[string]string{"app": "m"})
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(msPort)}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	ports := freePorts(t, 3)
	// Spans go to an OTLP receiver on loopback (--tracing is on by default).
	otlp := otlptest.Start(t)
	exited, stderr := startBinary(t, []string{"--kubeconfig=" + kubeconfig, "--pool-name=pool", "--pool-namespace=" + ns, "--secure-serving=false", "--metrics-endpoint-auth=false",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])},
		append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+otlp.Endpoint, "OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=50"))
	waitHealthServing(t, ports[1], exited, stderr, "readiness")
	// Pool gauges need a scrape of the model server.
	waitMetrics(t, ports[2], fmt.Sprintf(`inference_pool_average_queue_size{name="pool",namespace="%s"} 1`, ns))

	conn := eppclient.New(fmt.Sprintf("127.0.0.1:%d", ports[0]), eppclient.Options{})
	defer conn.Close()
	gateway(t, conn, []byte(`{"model":"m","prompt":"hello"}`), []byte(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":2,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":1}}}`))
	gateway(t, conn, []byte(`{"model":"m","prompt":"hello","stream":true}`), []byte("data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n"))
	gateway(t, conn, []byte(`{"model":`), nil) // refused 400: an error series

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range want {
		if !strings.Contains(string(body), "\n# TYPE "+m+" ") {
			t.Errorf("the dashboard queries %s, which /metrics does not export", m)
		}
	}
	for _, series := range []string{
		fmt.Sprintf(`inference_objective_request_total{model_name="m",namespace="%s",pool="pool",priority="0",target_model_name="m"} 2`, ns),
		fmt.Sprintf(`inference_objective_running_requests{model_name="m",namespace="%s",pool="pool"} 0`, ns),
		fmt.Sprintf(`inference_objective_prompt_cached_tokens_sum{model_name="m",namespace="%s",pool="pool",target_model_name="m"} 1`, ns),
		fmt.Sprintf(`inference_objective_normalized_time_per_output_token_seconds_count{model_name="m",namespace="%s",pool="pool",target_model_name="m"} 2`, ns),
		fmt.Sprintf(`inference_objective_request_ttft_seconds_count{model_name="m",namespace="%s",pool="pool",target_model_name="m"} 1`, ns),
		fmt.Sprintf(`inference_objective_request_tpot_seconds_count{model_name="m",namespace="%s",pool="pool",target_model_name="m"} 1`, ns),
		fmt.Sprintf(`inference_objective_request_error_total{error_code="BadRequest",model_name="",namespace="%s",pool="pool",target_model_name=""} 1`, ns),
		// Each of the two routed requests went through each plugin of the default profile once.
		`inference_extension_plugin_duration_seconds_count{extension_point="Filter",plugin_name="subset-filter",plugin_type="subset-filter"} 2`,
		`inference_extension_plugin_duration_seconds_count{extension_point="Scorer",plugin_name="prefix-cache-scorer",plugin_type="prefix-cache-scorer"} 2`,
		`inference_extension_plugin_duration_seconds_count{extension_point="Picker",plugin_name="max-score-picker",plugin_type="max-score-picker"} 2`,
	} {
		if !strings.Contains(string(body), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	// Every label a dashboard query matches on is one its metric carries,
	// under both names.
	for metric, labels := range selectorLabels(exprs) {
		for _, l := range labels {
			if !regexp.MustCompile(`(?m)^` + metric + `\{[^}]*\b` + l + `="`).Match(body) {
				t.Errorf("the dashboard selects %s by label %s, which its series do not carry", metric, l)
			}
			if to, ok := llmdNames[metric]; ok {
				if n, ok := to.labels[l]; ok {
					l = n
				}
				if !regexp.MustCompile(`(?m)^` + to.name + `\{[^}]*\b` + l + `="`).Match(body) {
					t.Errorf("the dashboard's query of %s, on the llm-d name %s, selects by label %s, which its series do not carry", metric, to.name, l)
				}
			}
		}
	}
	// The same queries on the llm-d names: each family the dashboard reads
	// is exported under its llm_d_epp_* name too, with the same series.
	for _, m := range want {
		to, ok := llmdNames[m]
		if !ok {
			if strings.HasPrefix(m, "inference_") {
				t.Errorf("the dashboard queries %s, which has no llm_d_epp_* name", m)
			}
			continue
		}
		if !strings.Contains(string(body), "\n# TYPE "+to.name+" ") {
			t.Errorf("the dashboard queries %s, whose llm-d name %s /metrics does not export", m, to.name)
		}
	}
	for from, to := range llmdNames {
		if got, want := seriesCount(string(body), to.name), seriesCount(string(body), from); got != want {
			t.Errorf("%s has %d series, %s %d: the names must export the same series", to.name, got, from, want)
		}
	}
	for _, series := range []string{
		fmt.Sprintf(`llm_d_epp_request_total{model_name="m",namespace="%s",pool="pool",priority="0",target_model_name="m"} 2`, ns),
		fmt.Sprintf(`llm_d_epp_request_error_total{error_code="BadRequest",model_name="",namespace="%s",pool="pool",target_model_name=""} 1`, ns),
		fmt.Sprintf(`llm_d_epp_average_queue_size{name="pool",namespace="%s"} 1`, ns),
		`llm_d_epp_plugin_duration_seconds_count{extension_point="Picker",plugin_name="max-score-picker",plugin_type="max-score-picker"} 2`,
	} {
		if !strings.Contains(string(body), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	if !regexp.MustCompile(`(?m)^llm_d_epp_scheduler_attempts_total\{endpoint_name="server",namespace="` + ns + `",pool="pool",port="\d+",status="success",target_model_name="m"\} 2$`).Match(body) {
		t.Errorf("/metrics lacks llm_d_epp_scheduler_attempts_total with endpoint_name (upstream's name of pod_name)")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}

	// The routed request's span, exported by the binary.
	span, ok := otlp.WaitFor(30*time.Second, func(s otlptest.Span) bool {
		return s.Attrs["poolpicker.pool"] == ns+"/pool" && s.Attrs["poolpicker.outcome"] == "completed"
	})
	if !ok {
		t.Fatalf("no span of the routed request reached the OTLP receiver; received %v; stderr:\n%s", otlp.Spans(), stderr.String())
	}
	if !strings.HasPrefix(span.Attrs["poolpicker.endpoint"], "127.0.15.2:") || span.Attrs["poolpicker.pool.resolution_source"] != "single-pool" ||
		span.Attrs["poolpicker.scheduling.duration_seconds"] == "" || span.Resource["service.name"] != "poolpicker" {
		t.Errorf("span %+v: want the endpoint, resolution source, scheduling time and service name", span)
	}
}

// seriesCount counts the sample lines of family name (a histogram's
// buckets, sum and count included) in an exposition page.
func seriesCount(page, name string) int {
	return len(regexp.MustCompile(`(?m)^`+name+`(_bucket|_sum|_count)?\{`).FindAllStringIndex(page, -1))
}

// gateway plays one full-duplex ext_proc stream: request headers and body,
// then (when the picker routed it) response headers and body. A nil
// respBody is a request the picker must refuse.
func gateway(t *testing.T, c *eppclient.Client, reqBody, respBody []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := eppclient.Request{Shape: eppclient.FullDuplex, Body: reqBody}
	if respBody != nil {
		contentType := "application/json"
		if bytes.HasPrefix(respBody, []byte("data:")) {
			contentType = "text/event-stream" // a streamed response
		}
		req.Response = &eppclient.Response{Status: 200, Headers: []eppclient.Header{{Key: "content-type", Value: contentType}}, Body: respBody}
	}
	res, err := c.Do(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case respBody == nil && res.Immediate == nil:
		t.Fatalf("bad body not refused: %+v", res)
	case respBody != nil && res.Destination == "":
		t.Fatalf("request not routed: %+v", res)
	}
}
