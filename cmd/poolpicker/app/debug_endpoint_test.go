// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/debugview"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// TestDebugEndpoint runs the built binary at -v=5 against the API server
// and a model server, routes requests through it, then reads /debug/pools
// over HTTP: the pool, its endpoint with its metrics' age and queue, and the
// decisions with each scorer's score; the picked log line carries the
// scores. With --metrics-endpoint-auth the page answers only a token whose
// user may get /debug/pools.
func TestDebugEndpoint(t *testing.T) {
	for _, auth := range []bool{false, true} {
		t.Run(fmt.Sprintf("auth %v", auth), func(t *testing.T) { testDebugEndpoint(t, auth) })
	}
}

func testDebugEndpoint(t *testing.T, auth bool) {
	writeKubeconfig(t)
	ctx := context.Background()
	ns := env.Namespace(t, "debug")
	ip := "127.0.16.2"
	if auth {
		ip = "127.0.16.3"
	}
	page, err := vllmpage.Page(vllmpage.State{Waiting: 3, Running: 2, KVCacheUsage: 0.25, BlockSize: 16, NumGPUBlocks: 1000}, vllmpage.Options{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	msPort := serveMetricsPage(t, ip, 0, page)
	readyPod(t, ns, "server", ip, map[string]string{"app": "m"})
	pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat"}}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
	pool.Spec.TargetPorts = []v1.Port{{Number: v1.PortNumber(msPort)}}
	pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	tokens := map[string]string{}
	if auth {
		tokens = debugTokens(t, ns)
	}
	ports := freePorts(t, 3)
	args := []string{"--kubeconfig=" + kubeconfig, "--pool-name=chat", "--pool-namespace=" + ns, "--secure-serving=false", "--tracing=false", "-v=5",
		fmt.Sprintf("--metrics-endpoint-auth=%v", auth), "--debug-decisions-per-pool=4",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}
	exited, stderr := startBinary(t, args, nil)
	waitHealthServing(t, ports[1], exited, stderr, "readiness")

	get := func(path, token string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", ports[2], path), nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	reader := tokens["debugger"]
	// The endpoint's queue comes from its first scrape.
	var view debugview.View
	poll.Until(t, 60*time.Second, "/debug/pools to show the endpoint's scrape", func() bool {
		code, body := get(debugview.Path, reader)
		if code != http.StatusOK || json.Unmarshal([]byte(body), &view) != nil {
			return false
		}
		return len(view.Pools) == 1 && len(view.Pools[0].Endpoints) == 1 && view.Pools[0].Endpoints[0].Metrics != nil
	})

	conn := eppclient.New(fmt.Sprintf("127.0.0.1:%d", ports[0]), eppclient.Options{})
	defer conn.Close()
	for range 6 {
		gateway(t, conn, []byte(`{"model":"m","prompt":"hello"}`), []byte(`{"choices":[{"text":"hi"}]}`))
	}
	code, body := get(debugview.Path+"?namespace="+ns+"&pool=chat", reader)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", debugview.Path, code, body)
	}
	view = debugview.View{}
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatalf("%v:\n%s", err, body)
	}
	if len(view.Pools) != 1 {
		t.Fatalf("pools %+v, want chat", view.Pools)
	}
	p := view.Pools[0]
	addr := fmt.Sprintf("%s:%d", ip, msPort)
	if p.Namespace != ns || p.Name != "chat" || !p.Synced || p.PickerService != "epp:9002" || p.Requests != 6 {
		t.Errorf("pool %s/%s synced %v picker %q requests %d", p.Namespace, p.Name, p.Synced, p.PickerService, p.Requests)
	}
	e := p.Endpoints[0]
	if e.Address != addr || e.Pod != ns+"/server" || e.Metrics == nil || e.Metrics.Waiting != 3 || e.Metrics.Running != 2 || e.Metrics.AgeSeconds < 0 || e.Metrics.AgeSeconds > 60 {
		t.Errorf("endpoint %+v metrics %+v, want %s with 3 waiting, 2 running, a recent scrape", e, e.Metrics, addr)
	}
	if len(p.Decisions) != 4 {
		t.Fatalf("%d decisions, want the last 4 of 6", len(p.Decisions))
	}
	for _, d := range p.Decisions {
		if len(d.Picked) != 1 || d.Picked[0] != addr || len(d.Scorers) == 0 || len(d.Candidates) != 1 || len(d.Candidates[0].Scores) != len(d.Scorers) {
			t.Errorf("decision %+v: want %s picked and every scorer's score of it", d, addr)
			continue
		}
		sum := 0.0
		for i, w := range d.Weights {
			sum += w * d.Candidates[0].Scores[i]
		}
		if math.Abs(sum-d.Candidates[0].Total) > 1e-9 {
			t.Errorf("decision %+v: the weighted scores add up to %v, not the total", d, sum)
		}
	}
	if !strings.Contains(body, `"prefix-cache-scorer"`) {
		t.Errorf("the default profile's prefix-cache scorer is not among the scorers:\n%s", body)
	}
	if other, _ := get(debugview.Path+"?namespace=elsewhere", reader); other != http.StatusOK {
		t.Errorf("a filter matching nothing: %d", other)
	}
	if _, none := get(debugview.Path+"?namespace=elsewhere", reader); !strings.Contains(none, `"pools": []`) {
		t.Errorf("a filter matching nothing lists %s", none)
	}
	scored := false
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "\tpicked\t") && strings.Contains(line, `"scores": {"`+addr+`":`) {
			scored = true
		}
	}
	if !scored {
		t.Errorf("no picked line with the endpoint's score at -v=5 in:\n%s", stderr.String())
	}

	if !auth {
		return
	}
	for _, c := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token that may get /metrics only", tokens["scraper"], http.StatusForbidden},
		{"a token that may get /debug/pools", tokens["debugger"], http.StatusOK},
	} {
		if code, body := get(debugview.Path, c.token); code != c.want {
			t.Errorf("%s: %d %.200q, want %d", c.name, code, body, c.want)
		}
	}
}

// debugTokens makes service accounts allowed to get /metrics (scraper) and
// /debug/pools (debugger), and returns their tokens.
func debugTokens(t *testing.T, ns string) map[string]string {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for name, url := range map[string]string{"scraper": "/metrics", "debugger": debugview.Path} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{url}, Verbs: []string{"get"}}}}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
		if err := env.Client.Create(ctx, role); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Client.Delete(context.Background(), binding)
			_ = env.Client.Delete(context.Background(), role)
		})
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tr.Status.Token
	}
	return tokens
}
