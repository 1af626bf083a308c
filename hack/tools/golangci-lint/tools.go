// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build tools

// Package tools pins golangci-lint, which `make lint` runs through `go run`, so
// nothing has to be installed beforehand.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
