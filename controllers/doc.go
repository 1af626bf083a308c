// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package controllers keeps poolpicker's datastore in step with the API
// server: it decides which InferencePools this picker serves, feeds each
// served pool its pods, and publishes each pool's objectives and model
// rewrites.
//
// A pool's pods come from one of two watch plans, chosen per namespace
// (Options.PodWatchPlan): a watch of the pool's own, scoped on the API
// server by its selector and namespace (per-pool), or one watch of every
// pod of the namespace, shared by its served pools and filtered here by
// each pool's selector (namespace). A pool's source is started by the pool
// reconciler once its selector is known; a selector change or a plan switch
// starts a new source whose first list replaces the endpoint set in one
// atomic swap before the old source stops; a pool that is deleted or stops
// being served has its source stopped, and a namespace watch stops with
// its last pool. There is no cluster-wide pod watch.
package controllers
