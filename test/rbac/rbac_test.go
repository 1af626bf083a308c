// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package rbac

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/devgateway"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/permissions"
	"github.com/poolpicker/poolpicker/internal/poll"
)

var httpClient = &http.Client{Timeout: 30 * time.Second}

// eventually polls cond, for states nothing signals (status written by
// another process, a metrics page).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 90*time.Second, what, cond)
}

// auditEvent is the part of an audit.k8s.io/v1 Event the test reads.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// serviceAccountRequests returns the audited requests of the ServiceAccount.
func serviceAccountRequests(t *testing.T, user string) []auditEvent {
	t.Helper()
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log line %q: %v", sc.Text(), err)
		}
		if e.User.Username == user {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func send(t *testing.T, host, body string) (code int, endpoint, respBody string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, stack.GatewayURL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("request to %s: %v", host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(devgateway.HeaderServedEndpoint), string(b)
}

func metricsPage(t *testing.T) string {
	t.Helper()
	resp, err := httpClient.Get("http://" + stack.Replicas()[0].MetricsAddr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestWholeFlowWithoutForbidden drives everything poolpicker does with the
// rendered RBAC: a leader elected, three pools in two namespaces served
// through the picker Services it provisions, objectives and a rewrite
// accepted (status written), model servers scraped, requests picked through
// ext_proc (a model rewrite included). The API server's audit log must show
// the ServiceAccount's requests, none answered 403.
func TestWholeFlowWithoutForbidden(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := stack.Client()

	// Status conditions, written by poolpicker with its status patch rule.
	eventually(t, "Accepted=True on every objective and rewrite", func() bool {
		var objectives v1alpha2.InferenceObjectiveList
		var rewrites v1alpha2.InferenceModelRewriteList
		if c.List(ctx, &objectives) != nil || c.List(ctx, &rewrites) != nil || len(objectives.Items) < 2 || len(rewrites.Items) < 1 {
			return false
		}
		for _, o := range objectives.Items {
			if !apimeta.IsStatusConditionTrue(o.Status.Conditions, v1alpha2.ConditionAccepted) {
				return false
			}
		}
		for _, r := range rewrites.Items {
			if !apimeta.IsStatusConditionTrue(r.Status.Conditions, v1alpha2.ConditionAccepted) {
				return false
			}
		}
		return true
	})

	// Picks through ext_proc, in both namespaces.
	for _, tc := range []struct{ host, model string }{
		{"chat.team-a.example", "meta-llama/Llama-3.1-8B-Instruct"},
		{"lora.team-a.example", "food-review"}, // rewritten to an adapter
		{"code.team-b.example", "Qwen/Qwen2.5-Coder-7B-Instruct"},
	} {
		body := fmt.Sprintf(`{"model":%q,"prompt":"hello from the rbac test","max_tokens":4}`, tc.model)
		code, endpoint, resp := send(t, tc.host, body)
		if code != http.StatusOK || endpoint == "" {
			t.Errorf("%s: %d from %q: %.300s", tc.host, code, endpoint, resp)
		}
	}

	// Scraping: every pool's endpoints report load.
	for _, pool := range []string{`name="chat",namespace="team-a"`, `name="lora",namespace="team-a"`, `name="code",namespace="team-b"`} {
		eventually(t, "scrapes of pool "+pool, func() bool {
			for _, line := range strings.Split(metricsPage(t), "\n") {
				if strings.HasPrefix(line, "inference_pool_metrics_scrapes_total{") && strings.Contains(line, pool) && !strings.HasSuffix(line, " 0") {
					return true
				}
			}
			return false
		})
	}

	user := "system:serviceaccount:" + saNamespace + ":" + saName
	events := serviceAccountRequests(t, user)
	seen := map[string]bool{}
	var forbidden []string
	for _, e := range events {
		if e.ObjectRef != nil && strings.HasPrefix(e.ObjectRef.Namespace, admissionTestNamespace+"-") {
			continue // TestAdmissionPolicyRefusesForeignWrites' refusals, made on purpose
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == http.StatusForbidden {
			forbidden = append(forbidden, e.Verb+" "+e.RequestURI)
		}
		if e.ObjectRef != nil {
			res := e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				res += "/" + e.ObjectRef.Subresource
			}
			seen[e.Verb+" "+res] = true
		}
	}
	if len(forbidden) > 0 {
		t.Errorf("%d requests of %s answered 403: %q", len(forbidden), user, forbidden)
	}
	// The audit log saw the work, so zero forbidden means something. (Lists
	// are streaming lists, audited as watches, where the API server offers
	// them; the list verb covers the fallback to plain lists.)
	for _, want := range []string{"watch pods", "watch inferencepools", "watch inferenceobjectives", "watch inferencemodelrewrites", "watch httproutes",
		"patch inferenceobjectives/status", "patch inferencemodelrewrites/status", "create selfsubjectaccessreviews",
		"create leases", "update leases", "watch services", "create services", "watch endpointslices", "create endpointslices"} {
		if !seen[want] {
			t.Errorf("the audit log shows no %q by %s (saw %v)", want, user, seen)
		}
	}
	t.Logf("%d audited requests of %s, none forbidden", len(events), user)
}

// TestEachMissingPermissionIsNamed runs the binary, with leader election
// and provisioning on, as a ServiceAccount that holds every rule but one
// verb, for each verb of each rule: it must exit 1 at start-up naming the
// verb, the resource and why it is needed. The pool rules are bound in the
// watched namespace and the deployment's own rules in its namespace, as the
// chart binds them with watchNamespaces, so that the pods rule of one scope
// cannot stand in for the other's.
func TestEachMissingPermissionIsNamed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := stack.Env
	ns := env.Namespace(t, "rbac-variant")
	const poolNS = "team-a"
	for i, r := range permissions.Rules {
		for _, verb := range r.Verbs {
			name := fmt.Sprintf("minus-%d-%s", i, verb)
			t.Run(strings.NewReplacer("/", "-", ".", "-").Replace(name+"-"+r.Resource), func(t *testing.T) {
				for scope, where := range map[permissions.Scope]string{permissions.PoolNamespaces: poolNS, permissions.OwnNamespace: ns} {
					role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", ns, name, scope)},
						Rules: deploytest.PolicyRulesWithout(permissions.Rules, scope, i, verb)}
					grant(ctx, t, role, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: where, Name: role.Name},
						RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
						Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}})
				}
				startupDenied(ctx, t, ns, name, poolNS, verb+" "+r.Resource, []string{r.Why, "system:serviceaccount:" + ns + ":" + name}, "--metrics-endpoint-auth=false")
			})
		}
	}
}

// grant creates a ClusterRole and the binding that gives it, removed when
// the test ends.
func grant(ctx context.Context, t *testing.T, role *rbacv1.ClusterRole, binding client.Object) {
	t.Helper()
	env := stack.Env
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
}

// startupDenied runs the binary as ServiceAccount ns/name on poolNS, with
// leader election and provisioning on (and args), and expects it to exit 1
// at start-up naming exactly one missing permission, denied ("VERB
// RESOURCE"), and each of wants.
func startupDenied(ctx context.Context, t *testing.T, ns, name, poolNS, denied string, wants []string, args ...string) {
	t.Helper()
	kubeconfig, err := serviceAccountKubeconfig(ctx, stack.Env, ns, name, filepath.Join(t.TempDir(), "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(runCtx, stack.Picker.Path, append([]string{"--kubeconfig=" + kubeconfig,
		"--watch-namespaces=" + poolNS, "--picker-namespace=" + ns, "--ha-enable-leader-election", "--provision-picker-services",
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if runCtx.Err() != nil {
		t.Fatalf("still running after 60s without %s (a silent stall); stderr:\n%s", denied, stderr.String())
	}
	if exit := (*exec.ExitError)(nil); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1; stderr:\n%s", err, stderr.String())
	}
	msg := stderr.String()
	for _, want := range append([]string{"missing RBAC permissions", denied}, wants...) {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr lacks %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n  - "); n != 1 {
		t.Errorf("%d permissions named, want exactly the one removed:\n%s", n, msg)
	}
}

// TestMissingMetricsAuthPermissionIsNamed runs the binary with
// --metrics-endpoint-auth on (its default, as upstream's) as a
// ServiceAccount that holds every rule it needs but one of the token and
// access reviews: it must exit 1 at start-up naming that one and the flag
// that does without it.
func TestMissingMetricsAuthPermissionIsNamed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	env := stack.Env
	ns := env.Namespace(t, "rbac-metrics-auth")
	const poolNS = "team-a"
	for i, missing := range permissions.MetricsAuthRules {
		name := "without-" + missing.Resource
		t.Run(name, func(t *testing.T) {
			subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}
			for scope, where := range map[permissions.Scope]string{permissions.PoolNamespaces: poolNS, permissions.OwnNamespace: ns} {
				role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", ns, name, scope)},
					Rules: deploytest.PolicyRulesWithout(permissions.Rules, scope, -1, "")}
				grant(ctx, t, role, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: where, Name: role.Name},
					RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}, Subjects: subjects})
			}
			reviews := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-reviews", ns, name)}}
			for j, r := range permissions.MetricsAuthRules {
				if j != i {
					reviews.Rules = append(reviews.Rules, rbacv1.PolicyRule{APIGroups: []string{r.Group}, Resources: []string{r.Resource}, Verbs: r.Verbs})
				}
			}
			grant(ctx, t, reviews, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: reviews.Name},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reviews.Name}, Subjects: subjects})

			startupDenied(ctx, t, ns, name, poolNS, "create "+missing.Resource, []string{missing.Why, "--metrics-endpoint-auth=false"})
		})
	}
}

// TestNamespacedInstallWithoutForbidden installs the chart's RBAC as it
// renders with watchNamespaces (the ClusterRole bound by RoleBindings in
// those namespaces only, the Role in the release's, the cluster-scoped
// token reviews of metrics authentication) and runs a second
// picker as that ServiceAccount on them, with leader election and
// provisioning on as the chart runs it (a follower of the stack's replica,
// whose Lease it shares): it passes its permission check, turns ready
// (every pool's pods listed) and gets no 403.
func TestNamespacedInstallWithoutForbidden(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const release, account = "scoped", "scoped-picker"
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{Release: release, Namespace: saNamespace,
		Values: "watchNamespaces: [team-a, team-b]\nserviceAccount: {name: " + account + "}\n"})
	if err != nil {
		t.Fatal(err)
	}
	bindings := 0
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRoleBinding":
			// The token reviews of --metrics-endpoint-auth (on by
			// default) are cluster-scoped, and read nothing of a
			// namespace; any other binding is access beyond them.
			if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ref != release+"-poolpicker-metrics-auth" {
				t.Fatalf("chart with watchNamespaces renders ClusterRoleBinding %s of %s: access beyond the namespaces", o.GetName(), ref)
			}
			if err := stack.Env.Client.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			t.Cleanup(func() { _ = stack.Env.Client.Delete(context.Background(), o.DeepCopy()) })
		case "RoleBinding":
			if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind"); ref == "ClusterRole" {
				bindings++
			}
			fallthrough
		case "ServiceAccount", "ClusterRole", "Role":
			if err := stack.Env.Client.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			t.Cleanup(func() { _ = stack.Env.Client.Delete(context.Background(), o.DeepCopy()) })
		}
	}
	if bindings != 2 {
		t.Fatalf("%d RoleBindings rendered, want one per watched namespace", bindings)
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
		Args: []string{"--kubeconfig=" + kubeconfig, "--watch-namespaces=team-a,team-b",
			"--picker-namespace=" + saNamespace, "--ha-enable-leader-election", "--provision-picker-services",
			fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2])}}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	user := "system:serviceaccount:" + saNamespace + ":" + account
	events := serviceAccountRequests(t, user)
	watchedPods := false
	for _, e := range events {
		if e.ObjectRef != nil && strings.HasPrefix(e.ObjectRef.Namespace, admissionTestNamespace+"-") {
			continue // TestAdmissionPolicyRefusesForeignWrites' refusals, made on purpose
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == http.StatusForbidden {
			t.Errorf("%s %s answered 403", e.Verb, e.RequestURI)
		}
		if e.ObjectRef != nil && e.ObjectRef.Resource == "pods" && e.Verb == "watch" {
			watchedPods = true
			if ns := e.ObjectRef.Namespace; ns != "team-a" && ns != "team-b" && ns != saNamespace {
				t.Errorf("pods watched in namespace %q", ns)
			}
		}
	}
	if !watchedPods {
		t.Errorf("the audit log shows no pod watch by %s", user)
	}
}
