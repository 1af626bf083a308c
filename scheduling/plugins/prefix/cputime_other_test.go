// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !linux

package prefix_test

// processCPUTime is not measured here: benchmarks report 0.
func processCPUTime() int64 { return 0 }
