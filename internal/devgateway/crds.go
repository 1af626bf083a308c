// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// GatewayAPIModule is the module whose Go types and CRDs the gateway uses;
// its version is the one go.mod pins.
const GatewayAPIModule = "sigs.k8s.io/gateway-api"

// CRDDir returns the directory of the Gateway API standard-channel CRDs
// (HTTPRoute, Gateway, GatewayClass, ...) shipped in the pinned
// sigs.k8s.io/gateway-api module, downloading the module into the module
// cache if needed. It runs the go command from dir, which must lie inside
// this project's module.
func CRDDir(ctx context.Context, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// The go command on PATH: go test and go run put their own
	// toolchain's first.
	gobin := "go"
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, gobin, "mod", "download", "-json", GatewayAPIModule)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("devgateway: go mod download %s: %w: %s", GatewayAPIModule, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out.Bytes(), &mod); err != nil {
		return "", fmt.Errorf("devgateway: go mod download output: %w", err)
	}
	if mod.Error != "" || mod.Dir == "" {
		return "", fmt.Errorf("devgateway: go mod download %s: %s", GatewayAPIModule, mod.Error)
	}
	crds := filepath.Join(mod.Dir, "config", "crd", "standard")
	if _, err := os.Stat(filepath.Join(crds, "gateway.networking.k8s.io_httproutes.yaml")); err != nil {
		return "", errors.Join(fmt.Errorf("devgateway: no HTTPRoute CRD in %s", crds), err)
	}
	return crds, nil
}
