// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package e2e holds poolpicker's end-to-end tests: a real control plane, the
// sample manifests of config/samples/local, simulated model servers on
// loopback IPs, a real poolpicker process and the development gateway
// (internal/localstack), driven through HTTP as clients would.
package e2e
