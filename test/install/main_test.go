// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var (
	env  *testenv.Env
	tool *deploytest.Tool
	root string
	// pickerBinary is cmd/poolpicker, built once by TestMain.
	pickerBinary string
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		var err error
		if root, err = testenv.RepoRoot(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The ServiceMonitor CRD, so that the monitoring objects dry-run
		// against their real schema.
		sm, err := deploytest.ServiceMonitorCRD(ctx, root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		tool = deploytest.NewTool(root)
		defer tool.Close()
		// The builds take what they take on a cold cache, outside every
		// test's deadline.
		if _, err := tool.Build(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binDir, err := os.MkdirTemp("", "poolpicker-install-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(binDir)
		if pickerBinary, err = localstack.BuildPicker(context.Background(), root, binDir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// And the PrometheusRule CRD beside it, for the chart's alerts.
		rules := filepath.Join(filepath.Dir(sm), "monitoring.coreos.com_prometheusrules.yaml")
		return testenv.RunMain(m, &env, testenv.Options{ExtraCRDDirs: []string{sm, rules}})
	}())
}

func writeKubeconfig(path string) error { return testenv.WriteKubeconfig(env.Config, path) }
