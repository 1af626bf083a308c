// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package robustness tries hostile and broken input on a running poolpicker
// process (real API server, real model servers, the development gateway) and
// checks after each case that the process still runs, still routes a
// request for every pool, and that its memory came back.
package robustness
