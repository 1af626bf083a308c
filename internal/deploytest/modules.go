// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package deploytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
)

// Published manifests the tests install, read as data from the module cache.
const (
	// UpstreamModule holds the Inference Extension's published CRDs
	// (config/crd/bases); poolpicker must work with them installed.
	UpstreamModule = "sigs.k8s.io/gateway-api-inference-extension@v1.5.0"
	// PrometheusOperatorModule holds the ServiceMonitor CRD the
	// servicemonitor overlay and the chart's ServiceMonitor need.
	PrometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
)

// ModuleDir downloads module@version into the module cache (a no-op when
// present) and returns its directory. An explicit version works outside the
// main module's requirements, so nothing of it is imported or required.
func ModuleDir(ctx context.Context, root, moduleAtVersion string) (string, error) {
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goBinary(), "mod", "download", "-json", moduleAtVersion)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &out, &stderr
	runErr := cmd.Run()
	var mod struct{ Dir, Error string }
	jsonErr := json.Unmarshal(out.Bytes(), &mod) // a failed download still says why in Error
	if runErr != nil {
		return "", fmt.Errorf("deploytest: go mod download %s: %w %s %s", moduleAtVersion, runErr, mod.Error, bytes.TrimSpace(stderr.Bytes()))
	}
	if jsonErr != nil || mod.Error != "" || mod.Dir == "" {
		return "", fmt.Errorf("deploytest: go mod download %s: %s %s", moduleAtVersion, mod.Error, bytes.TrimSpace(stderr.Bytes()))
	}
	return mod.Dir, nil
}

// UpstreamCRDDir returns the directory of the Inference Extension's
// published CRDs.
func UpstreamCRDDir(ctx context.Context, root string) (string, error) {
	dir, err := ModuleDir(ctx, root, UpstreamModule)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "config", "crd", "bases"), nil
}

// ServiceMonitorCRD returns the path of the Prometheus Operator's
// ServiceMonitor CRD.
func ServiceMonitorCRD(ctx context.Context, root string) (string, error) {
	dir, err := ModuleDir(ctx, root, PrometheusOperatorModule)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_servicemonitors.yaml"), nil
}
