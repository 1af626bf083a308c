// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build tools

// Package tools pins the code generators poolpicker runs through `go run`, so
// nothing has to be installed beforehand.
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
