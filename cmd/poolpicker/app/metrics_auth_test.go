// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestMetricsEndpointAuth runs the built binary with its defaults
// (--metrics-endpoint-auth on, as upstream) and --enable-pprof against the
// API server, which reviews real ServiceAccount tokens: /metrics and the
// pprof pages answer only a token whose user may get that path.
func TestMetricsEndpointAuth(t *testing.T) {
	writeKubeconfig(t)
	ctx := context.Background()
	ns := env.Namespace(t, "metrics-auth")
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// scraper may get /metrics, profiler the pprof pages, stranger nothing.
	grants := map[string][]string{"scraper": {"/metrics"}, "profiler": {"/debug/pprof/", "/debug/pprof/*"}, "stranger": nil}
	tokens := map[string]string{}
	for name, urls := range grants {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if urls != nil {
			role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
				Rules: []rbacv1.PolicyRule{{NonResourceURLs: urls, Verbs: []string{"get"}}}}
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
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tr.Status.Token
	}

	ports := freePorts(t, 3)
	exited, stderr := startBinary(t, []string{"--kubeconfig=" + kubeconfig, "--watch-namespaces=" + ns, "--secure-serving=false", "--tracing=false", "--enable-pprof",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}, nil)
	// Readiness follows the pool controller, started with the metrics server.
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
	cases := []struct {
		name, path, token string
		wantCode          int
		wantBody          string
	}{
		{"metrics without a token", "/metrics", "", http.StatusUnauthorized, "Unauthorized"},
		// controller-runtime's filter, as upstream's EPP, answers a token
		// the API server cannot read as a failed review, not 401.
		{"metrics with a forged token", "/metrics", "not-a-token", http.StatusInternalServerError, "Authentication failed"},
		{"metrics with a token lacking get /metrics", "/metrics", tokens["stranger"], http.StatusForbidden, "Authorization denied for user system:serviceaccount:" + ns + ":stranger"},
		{"metrics with a token allowed to get /metrics", "/metrics", tokens["scraper"], http.StatusOK, "inference_extension_info"},
		{"the same token again (cached answer)", "/metrics", tokens["scraper"], http.StatusOK, "inference_extension_info"},
		{"pprof without a token", "/debug/pprof/", "", http.StatusUnauthorized, "Unauthorized"},
		{"pprof with the metrics token", "/debug/pprof/", tokens["scraper"], http.StatusForbidden, "Authorization denied"},
		{"pprof index with a pprof token", "/debug/pprof/", tokens["profiler"], http.StatusOK, "goroutine"},
		{"a pprof profile with a pprof token", "/debug/pprof/goroutine?debug=1", tokens["profiler"], http.StatusOK, "goroutine profile:"},
		{"metrics with the pprof token", "/metrics", tokens["profiler"], http.StatusForbidden, "Authorization denied"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := get(c.path, c.token)
			if code != c.wantCode || !strings.Contains(body, c.wantBody) {
				t.Errorf("GET %s: %d %.200q, want %d containing %q", c.path, code, body, c.wantCode, c.wantBody)
			}
		})
	}
}
