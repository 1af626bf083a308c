// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/conformance"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

const (
	namespace    = "eppconform"
	maxBodyBytes = 1 << 20
)

var (
	env                 *testenv.Env
	eppAddr, healthAddr string
	root, binaryPath    string
	kubeconfigPath      string
	logDir              string
)

// TestMain starts a control plane and one poolpicker, built once, serving
// every pool of the suite's namespace with the conformance-test behaviours
// on, as the suite's report on the site runs it.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env, err = testenv.Start(testenv.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
			code = 1
		}
	}()
	dir, err := os.MkdirTemp("", "eppconform-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary, err := localstack.BuildPicker(context.Background(), root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(env.Config, kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binaryPath, kubeconfigPath, logDir = binary, kubeconfig, dir
	p, err := startPicker(ctx, "poolpicker.log", "--watch-namespaces="+namespace, "--pool-selector=",
		"--enable-conformance-test-behaviors", fmt.Sprintf("--max-request-body-bytes=%d", maxBodyBytes))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	eppAddr, healthAddr = p.eppAddr, p.HealthAddr
	code = m.Run()
	if err := p.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "poolpicker:", err)
		code = 1
	}
	if code != 0 {
		b, _ := os.ReadFile(p.Log)
		fmt.Fprintf(os.Stderr, "poolpicker log:\n%s\n", tail(b))
	}
	return code
}

// picker is a poolpicker process of the test binary's build.
type picker struct {
	*localstack.Process
	eppAddr string
}

// startPicker starts the built poolpicker on free ports with args, and
// returns once it is ready.
func startPicker(ctx context.Context, log string, args ...string) (*picker, error) {
	ports, err := localstack.FreePorts(3)
	if err != nil {
		return nil, err
	}
	p := &picker{eppAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Process: &localstack.Process{Path: binaryPath, Log: filepath.Join(logDir, log),
		HealthAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), Args: append([]string{
			"--kubeconfig=" + kubeconfigPath, fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]),
			fmt.Sprintf("--metrics-port=%d", ports[2]), "--metrics-endpoint-auth=false", "--tracing=false"}, args...)}}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// TestSinglePoolPicker runs the suite as against a single-pool picker:
// poolpicker started for the primary pool only (as the reference EPP is), the
// protocol and conformance-suite parts claimed, no multi-pool. Every case it
// can run passes; the multi-pool and extension ones are skipped, none failed.
func TestSinglePoolPicker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const ns = namespace + "-single"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	p, err := startPicker(ctx, "single.log", "--pool-name="+conformance.PrimaryPool, "--pool-namespace="+ns, "--enable-conformance-test-behaviors")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	outcomes, err := conformance.Run(ctx, conformance.Options{
		EPPAddr: p.eppAddr, HealthAddr: p.HealthAddr, TLS: true, Config: env.Config, Namespace: ns, FirstIP: "127.0.61.2",
		Parts: []conformance.Part{conformance.Protocol, conformance.Interop, conformance.SuiteBehaviour},
	})
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	if err := conformance.Report(&report, outcomes); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", report.String())
	passed := 0
	for _, o := range outcomes {
		wantSkip := o.MultiPool || o.Part == conformance.Extension
		switch {
		case o.Status == conformance.Failed:
			t.Errorf("%s failed: %s", o.Name, o.Detail)
		case wantSkip != (o.Status == conformance.Skipped):
			t.Errorf("%s: %s (%s), want skipped %v", o.Name, o.Status, o.Detail, wantSkip)
		case o.Status == conformance.Passed:
			passed++
		}
	}
	if passed == 0 {
		t.Error("no case passed")
	}
}

func tail(b []byte) []byte {
	if len(b) > 8000 {
		return b[len(b)-8000:]
	}
	return b
}

// TestPoolpicker runs every case against poolpicker, claiming every part
// of the contract: each case passes (none is skipped but for what the
// options leave out).
func TestPoolpicker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	outcomes, err := conformance.Run(ctx, conformance.Options{
		EPPAddr: eppAddr, HealthAddr: healthAddr, TLS: true, Config: env.Config, Namespace: namespace,
		Parts:     []conformance.Part{conformance.Protocol, conformance.Interop, conformance.SuiteBehaviour, conformance.Extension},
		MultiPool: true, MaxBodyBytes: maxBodyBytes,
	})
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	if err := conformance.Report(&report, outcomes); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", report.String())
	if len(outcomes) != len(conformance.Cases()) {
		t.Errorf("%d outcomes of %d cases", len(outcomes), len(conformance.Cases()))
	}
	for _, o := range outcomes {
		t.Run(o.Name, func(t *testing.T) {
			switch o.Status {
			case conformance.Failed:
				t.Error(o.Detail)
			case conformance.Skipped:
				t.Errorf("skipped (%s), although poolpicker claims every part", o.Detail)
			}
		})
	}
	if path := os.Getenv("EPPCONFORM_MARKDOWN"); path != "" {
		var md bytes.Buffer
		if err := conformance.Markdown(&md, outcomes); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSiteReportListsEveryCase keeps the report on the site in step with the
// cases.
func TestSiteReportListsEveryCase(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "site-src", "conformance.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conformance.Cases() {
		if !strings.Contains(string(doc), "| "+c.Name+" | "+string(c.Part)+" | passed |") {
			t.Errorf("site-src/conformance.md's report lacks %q (%s) as passed: regenerate it with EPPCONFORM_MARKDOWN=FILE go test ./conformance", c.Name, c.Part)
		}
	}
}
