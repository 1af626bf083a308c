// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package rbac

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/localstack"
)

// TestChartMetricsEndpointAuth installs the RBAC the chart renders with
// metrics.endpointAuth at its default, on (the token reviews' ClusterRole
// for the picker, the metrics-reader ClusterRole bound to the reader listed
// in the values) and
// runs a picker as the chart's ServiceAccount with the chart's metrics flag:
// it passes its start-up check, and its metrics port answers the listed
// reader's token 200, another account's 403 and no token 401.
func TestChartMetricsEndpointAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const release, account, reader = "authed", "authed-picker", "authed-scraper"
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{Release: release, Namespace: saNamespace, Values: fmt.Sprintf(`
watchNamespaces: [team-a]
serviceAccount: {name: %s}
leaderElection: {enabled: false}
provisionPickerServices: {enabled: false}
metrics:
  endpointAuth: {readers: [{name: %s, namespace: %s}]}
`, account, reader, saNamespace)})
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			args, _, _ = unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := stack.Env.Client.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			t.Cleanup(func() { _ = stack.Env.Client.Delete(context.Background(), o.DeepCopy()) })
		}
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--metrics-endpoint-auth") }) {
		t.Fatalf("the chart passes %v; with metrics.endpointAuth on it should leave --metrics-endpoint-auth at its default (on)", args)
	}
	kubeconfig, err := serviceAccountKubeconfig(ctx, stack.Env, saNamespace, account, filepath.Join(t.TempDir(), "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	p := &localstack.Process{Path: stack.Picker.Path, Log: filepath.Join(t.TempDir(), "picker.log"), HealthAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		Args: []string{"--kubeconfig=" + kubeconfig, "--watch-namespaces=team-a",
			fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("the picker with the chart's RBAC did not start: %v", err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stopping: %v", err)
		}
	}()
	readerCfg, err := stack.Env.ServiceAccountConfig(ctx, saNamespace, reader)
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, err := stack.Env.ServiceAccountConfig(ctx, saNamespace, "authed-stranger")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"the listed reader", readerCfg.BearerToken, http.StatusOK},
		{"an account without the reader role", otherCfg.BearerToken, http.StatusForbidden},
		{"no token", "", http.StatusUnauthorized},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2]), nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: /metrics answered %d, want %d", c.who, resp.StatusCode, c.want)
		}
	}
}
