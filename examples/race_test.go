// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build race

package examples

// raceEnabled: the examples' tests run with the race detector when these do.
const raceEnabled = true
