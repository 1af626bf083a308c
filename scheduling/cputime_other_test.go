// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !linux

package scheduling

// threadCPUTime is not measured off Linux.
func threadCPUTime() int64 { return 0 }
