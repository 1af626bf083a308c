// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package deploytest renders poolpicker's install manifests (the kustomize
// tree of config/deploy and the Helm chart of charts/poolpicker) for tests,
// through the pinned tool module hack/tools/manifests.
package deploytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/poolpicker/poolpicker/internal/permissions"
)

// Tool runs the manifests tool, built once per process.
type Tool struct {
	root string
	once sync.Once
	path string
	err  error
	dir  string
}

// NewTool returns a Tool for the repository at root; Close removes its build.
func NewTool(root string) *Tool { return &Tool{root: root} }

// Close removes the built tool.
func (t *Tool) Close() error {
	if t.dir == "" {
		return nil
	}
	return os.RemoveAll(t.dir)
}

// goBinary is the go command on PATH: go test puts its own toolchain's
// first.
func goBinary() string { return "go" }

// Build compiles hack/tools/manifests, once; Run builds it when Build was
// not called. The first build on a machine takes minutes (Helm, kustomize),
// later ones are cache hits, so it runs under no deadline: call it from
// TestMain, before any test's clock starts.
func (t *Tool) Build() (string, error) {
	t.once.Do(func() {
		if t.dir, t.err = os.MkdirTemp("", "poolpicker-manifests-"); t.err != nil {
			return
		}
		t.path = filepath.Join(t.dir, "manifests")
		cmd := exec.Command(goBinary(), "build", "-o", t.path, ".")
		cmd.Dir = filepath.Join(t.root, "hack", "tools", "manifests")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.err = fmt.Errorf("deploytest: building hack/tools/manifests: %w\n%s", err, out)
		}
	})
	return t.path, t.err
}

// Run runs the tool with args and returns its standard output.
func (t *Tool) Run(ctx context.Context, args ...string) ([]byte, error) {
	path, err := t.Build()
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("manifests %v: %w\n%s%s", args, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// Kustomize renders the kustomization at dir (relative to the repository root).
func (t *Tool) Kustomize(ctx context.Context, dir string) ([]*unstructured.Unstructured, error) {
	out, err := t.Run(ctx, "kustomize", filepath.Join(t.root, dir))
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// ChartOptions select how the chart is rendered.
type ChartOptions struct {
	// Values is YAML merged over the chart's values.yaml.
	Values string
	// Kubeconfig, when set, lets templates' lookup calls ask that API server.
	Kubeconfig string
	// Namespace of the release. Empty: poolpicker-system.
	Namespace string
	// Release name. Empty: poolpicker.
	Release string
}

func (t *Tool) chartArgs(cmd string, o ChartOptions) ([]string, func(), error) {
	args := []string{cmd, "--chart", filepath.Join(t.root, "charts", "poolpicker")}
	if o.Namespace != "" {
		args = append(args, "--namespace", o.Namespace)
	}
	if o.Release != "" {
		args = append(args, "--release", o.Release)
	}
	if o.Kubeconfig != "" && cmd == "render" {
		args = append(args, "--kubeconfig", o.Kubeconfig)
	}
	cleanup := func() {}
	if o.Values != "" {
		f, err := os.CreateTemp("", "values-*.yaml")
		if err != nil {
			return nil, nil, err
		}
		cleanup = func() { os.Remove(f.Name()) }
		if _, err := io.WriteString(f, o.Values); err != nil {
			f.Close()
			cleanup()
			return nil, nil, err
		}
		if err := f.Close(); err != nil {
			cleanup()
			return nil, nil, err
		}
		args = append(args, "--values", f.Name())
	}
	return args, cleanup, nil
}

// Chart renders charts/poolpicker.
func (t *Tool) Chart(ctx context.Context, o ChartOptions) ([]*unstructured.Unstructured, error) {
	args, cleanup, err := t.chartArgs("render", o)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	out, err := t.Run(ctx, args...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// LintChart lints charts/poolpicker; it fails on any warning.
func (t *Tool) LintChart(ctx context.Context, o ChartOptions) (string, error) {
	args, cleanup, err := t.chartArgs("lint", o)
	if err != nil {
		return "", err
	}
	defer cleanup()
	out, err := t.Run(ctx, args...)
	return string(out), err
}

// Decode splits a multi-document YAML stream into objects, skipping empty
// documents.
func Decode(manifests []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Find returns the object of kind and name among objs, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// PolicyRulesWithout turns the rules of one scope into RBAC rules, leaving
// out the verb skipVerb of rules[skipRule] (a skipRule of -1 leaves out
// nothing): the ClusterRole (permissions.PoolNamespaces) or the Role
// (permissions.OwnNamespace) of a test that takes one permission away.
func PolicyRulesWithout(rules []permissions.Rule, scope permissions.Scope, skipRule int, skipVerb string) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for i, r := range rules {
		if r.Scope != scope {
			continue
		}
		var verbs []string
		for _, v := range r.Verbs {
			if i != skipRule || v != skipVerb {
				verbs = append(verbs, v)
			}
		}
		if len(verbs) > 0 {
			out = append(out, rbacv1.PolicyRule{APIGroups: []string{r.Group}, Resources: []string{r.Resource}, Verbs: verbs})
		}
	}
	return out
}
