// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

// Package testenv starts a real control plane (etcd and kube-apiserver built
// by `make control-plane`) with poolpicker's CRDs installed, for tests and
// benchmarks that must talk to a real API server, and what the suites that
// run the built picker share: its resident memory, its metrics and gRPC
// connections to it. It is not built for Windows, where
// controller-runtime's envtest does not build.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
)

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a controller-runtime client over Config with Scheme.
	Client client.Client
	// Scheme knows the core Kubernetes types and poolpicker's API types.
	Scheme *runtime.Scheme
	// Root is the repository root.
	Root string

	env *envtest.Environment
}

// Options tune Start. The zero value is a control plane with the CRDs of
// config/crd/bases installed.
type Options struct {
	// CRDDirs, when set, replace config/crd/bases as the source of the
	// InferencePool, InferenceObjective and InferenceModelRewrite CRDs (tests
	// install the Inference Extension's published CRDs with it).
	CRDDirs []string
	// ExtraCRDDirs are further directories of CRD manifests to install
	// (for example the Gateway API HTTPRoute CRDs).
	ExtraCRDDirs []string
	// APIServerArgs are extra kube-apiserver flags, name → value.
	APIServerArgs map[string]string
	// EtcdDataDir, when set, is etcd's data directory, kept after Stop:
	// a benchmark populates a cluster once and starts fresh control planes
	// on copies of it. Empty: a temporary directory removed by Stop.
	EtcdDataDir string
}

// Scheme returns a scheme with the core Kubernetes types and poolpicker's API types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(s))
	must(v1.AddToScheme(s))
	must(v1alpha2.AddToScheme(s))
	must(llmdv1alpha2.AddToScheme(s))
	return s
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// RepoRoot walks up from the working directory to the directory holding the
// project's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && len(b) > 0 &&
			containsModule(string(b), "module github.com/poolpicker/poolpicker\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: repository root (go.mod of github.com/poolpicker/poolpicker) not found above the working directory")
		}
		dir = parent
	}
}

func containsModule(gomod, line string) bool {
	return len(gomod) >= len(line) && gomod[:len(line)] == line
}

// AssetsDir is where kube-apiserver and etcd are looked up: $KUBEBUILDER_ASSETS
// when set, else <root>/bin.
func AssetsDir(root string) string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(root, "bin")
}

// Start starts etcd and kube-apiserver and installs the CRDs. Stop it with Stop.
func Start(opts Options) (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets := AssetsDir(root)
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("testenv: %s not found in %s: run `make control-plane` (or `make test`, which builds it) first", b, assets)
		}
	}
	scheme := Scheme()
	crdDirs := opts.CRDDirs
	if len(crdDirs) == 0 {
		crdDirs = []string{filepath.Join(root, "config", "crd", "bases")}
	}
	e := &envtest.Environment{
		CRDDirectoryPaths:     append(append([]string(nil), crdDirs...), opts.ExtraCRDDirs...),
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
		Scheme:                scheme,
		// envtest's 20 s is short when a busy 2-core machine runs several
		// packages' control planes at once; a slow start is not a failure.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	e.ControlPlane.Etcd = &envtest.Etcd{DataDir: opts.EtcdDataDir}
	// etcd's default 2 GiB of backend is filled by suites that create and
	// delete large objects for long (the isolation suite's Pending pods,
	// 400 a window), since it keeps what compaction freed; 8 GiB is etcd's
	// largest recommended quota.
	e.ControlPlane.Etcd.Configure().Set("quota-backend-bytes", strconv.Itoa(8<<30))
	api := e.ControlPlane.GetAPIServer()
	// There is no kubelet or node, and the kubernetes Service endpoints would
	// otherwise point at a loopback address the API server refuses.
	api.Configure().Set("endpoint-reconciler-type", "none")
	for k, v := range opts.APIServerArgs {
		api.Configure().Set(k, v)
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("testenv: starting control plane from %s: %w", assets, err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, Root: root, env: e}, nil
}

// Stop stops the control plane and removes its data.
func (e *Env) Stop() error { return e.env.Stop() }

// RunMain is a TestMain body: it starts a control plane, stores it in *env,
// runs the tests and stops it. It exits non-zero when the control plane
// cannot start.
func RunMain(m *testing.M, env **Env, opts Options) int {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stop:", err)
	}
	return code
}

var nsCounter atomic.Int64

// Namespace creates a namespace with a unique name starting with prefix and
// deletes it when the test ends.
func (e *Env) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid()%100000, nsCounter.Add(1))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Client.Delete(ctx, ns)
	})
	return name
}
