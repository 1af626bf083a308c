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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/poolpicker/poolpicker/conformance"
	"github.com/poolpicker/poolpicker/internal/localstack"
)

// externalEPPEnv names another picker's binary (EPPCONFORM_EXTERNAL_EPP) for
// TestExternalPickerSinglePool; unset, that test is skipped.
// externalArgsEnv (EPPCONFORM_EXTERNAL_ARGS) holds further flags it runs
// with, separated by spaces (a --config-file path is relative to this
// package's directory).
const (
	externalEPPEnv  = "EPPCONFORM_EXTERNAL_EPP"
	externalArgsEnv = "EPPCONFORM_EXTERNAL_ARGS"
)

// TestExternalPickerSinglePool runs the suite against another picker's
// binary (the Inference Extension's lwepp, llm-d's EPP), started for the
// primary pool as the Inference Extension's suite starts lwepp: single-pool
// mode, its defaults (ext_proc over TLS with a self-signed certificate), the
// kubeconfig in KUBECONFIG (these binaries have no --kubeconfig flag), and
// only what a loopback run must set beside them (ports, no tracing
// exporter, no metrics-endpoint authentication). The protocol, interop and
// suite parts are claimed; the multi-pool and extension cases must be
// skipped and every other case must have run (passed, or failed with its
// reason). EPPCONFORM_MARKDOWN=FILE writes the outcomes as the site's table;
// conformance/NOTES.md has the commands.
func TestExternalPickerSinglePool(t *testing.T) {
	binary := os.Getenv(externalEPPEnv)
	if binary == "" {
		t.Skipf("%s names no picker binary", externalEPPEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const ns = namespace + "-external"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfigPath)
	p := &localstack.Process{Path: binary, Log: filepath.Join(t.TempDir(), "external.log"), HealthAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		Args: []string{"--pool-name=" + conformance.PrimaryPool, "--pool-namespace=" + ns,
			fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]),
			"--tracing=false", "--metrics-endpoint-auth=false"}}
	p.Args = append(p.Args, strings.Fields(os.Getenv(externalArgsEnv))...)
	// Such a picker may turn ready only once its pool exists, which the
	// suite creates: it is started beside the run, which waits for it to
	// route the pool.
	started := make(chan error, 1)
	go func() { started <- p.Start(ctx) }()
	defer func() {
		if err := <-started; err != nil {
			t.Errorf("%s: %v", binary, err)
		}
		_ = p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("%s log:\n%s", binary, tail(b))
		}
	}()
	outcomes, err := conformance.Run(ctx, conformance.Options{
		EPPAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), HealthAddr: p.HealthAddr, TLS: true, Config: env.Config, Namespace: ns,
		FirstIP: "127.0.62.2", Ready: 2 * time.Minute,
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
	ran := 0
	for _, o := range outcomes {
		wantSkip := o.MultiPool || o.Part == conformance.Extension
		if wantSkip != (o.Status == conformance.Skipped) {
			t.Errorf("%s: %s (%s), want skipped %v", o.Name, o.Status, o.Detail, wantSkip)
		}
		if o.Status == conformance.Failed && o.Detail == "" {
			t.Errorf("%s failed without a reason", o.Name)
		}
		if o.Status != conformance.Skipped {
			ran++
		}
	}
	if ran == 0 {
		t.Error("no case ran")
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
