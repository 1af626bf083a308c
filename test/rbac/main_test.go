// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package rbac

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// The identity the rendered manifests give poolpicker.
const (
	saNamespace = "poolpicker-system"
	saName      = "poolpicker"
)

var (
	tool     *deploytest.Tool
	stack    *localstack.Stack
	auditLog string
)

// auditPolicy records every request's metadata (user, verb, resource,
// response code), so that the test can count forbidden answers.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "poolpicker-rbac-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The builds take what they take on a cold cache; the deadline below is
	// for the stack, not for them.
	tool = deploytest.NewTool(root)
	defer tool.Close()
	if _, err := tool.Build(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	picker, err := localstack.BuildPicker(context.Background(), root, dir, "-race")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	upstream, err := deploytest.UpstreamCRDDir(ctx, root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	auditLog = filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rbac, err := renderedRBAC(ctx, tool)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := localstack.Start(ctx, localstack.Options{
		Dir:     filepath.Join(dir, "stack"),
		FirstIP: "127.0.70.2",
		// One replica with its Pod in poolpicker-system, leader election
		// and picker Service provisioning on, as the manifests run it: the
		// gateway reaches the pools only through the Services and
		// EndpointSlices poolpicker provisions with these rules.
		PickerReplicas: 1,
		FirstPickerIP:  "127.0.71.2",
		GatewayAddr:    "127.0.0.1:0",
		GRPCPort:       ports[0], HealthPort: ports[1], MetricsPort: ports[2],
		PickerBinary: picker,
		PickerArgs:   []string{"-v=2"},
		ControlPlane: testenv.Options{
			CRDDirs:       []string{upstream},
			APIServerArgs: map[string]string{"audit-policy-file": policy, "audit-log-path": auditLog},
		},
		// The manifests' RBAC, applied as rendered, and a token of their
		// ServiceAccount: poolpicker gets nothing else.
		PickerKubeconfig: func(ctx context.Context, env *testenv.Env) (string, error) {
			for _, o := range rbac {
				if err := env.Client.Create(ctx, o.DeepCopy()); err != nil {
					return "", fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
				}
			}
			return serviceAccountKubeconfig(ctx, env, saNamespace, saName, filepath.Join(dir, "picker.kubeconfig"))
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rbac: starting the local stack:", err)
		return 1
	}
	stack = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "rbac: stopping the local stack:", err)
		code = 1
	}
	// The picker is race-built: a race it reports fails the run.
	if log, raced := testenv.RaceReported(s.Picker.Log); raced {
		fmt.Fprintf(os.Stderr, "rbac: the poolpicker process reported a data race:\n%s\n", log)
		code = 1
	}
	if code == 0 {
		if err := testenv.LeakedGoroutines(); err != nil {
			fmt.Fprintln(os.Stderr, "rbac: goroutines left behind:", err)
			code = 1
		}
	}
	return code
}

// renderedRBAC is the Namespace, ServiceAccount, ClusterRoles, Role,
// bindings and admission policy (with its binding) of config/deploy/base as
// kustomize renders them: the picker's
// own and, since its metrics port wants a token by default, the token
// reviews' and the metrics reader's.
func renderedRBAC(ctx context.Context, tool *deploytest.Tool) ([]*unstructured.Unstructured, error) {
	objs, err := tool.Kustomize(ctx, "config/deploy/base")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	kinds := []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	for _, kind := range kinds {
		n := 0
		for _, o := range objs {
			if o.GetKind() == kind {
				out = append(out, o)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("config/deploy/base renders no %s", kind)
		}
	}
	return out, nil
}

// serviceAccountKubeconfig writes a kubeconfig that reaches the API server as
// namespace/name with a TokenRequest token.
func serviceAccountKubeconfig(ctx context.Context, env *testenv.Env, namespace, name, path string) (string, error) {
	cfg, err := env.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	return path, testenv.WriteKubeconfig(cfg, path)
}
