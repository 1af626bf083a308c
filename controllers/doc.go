// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package controllers keeps poolpicker's datastore in step with the API
// server: it decides which InferencePools this picker serves, runs one pod
// watch per served pool scoped on the API server by the pool's selector and
// namespace, and publishes each pool's objectives and model rewrites.
//
// There is no cluster-wide or namespace-wide pod watch: a pool's pod watch is
// started by the pool reconciler once the pool's selector is known, a
// selector change starts a new watch whose first list replaces the endpoint
// set in one atomic swap before the old watch stops, and a pool that is
// deleted or stops being served has its watch stopped.
package controllers
