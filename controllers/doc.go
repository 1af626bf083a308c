// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package controllers keeps poolpicker's datastore in step with the API
// server: it decides which InferencePools this picker serves, hands each
// served pool to the pod sources (package podsource) that feed it its
// pods, and publishes each pool's objectives and model rewrites; the
// leader writes pool claims, picker Services and Accepted conditions.
//
// The process makes the controller-runtime manager with ManagerOptions,
// calls Setup, which adds the reconcilers (PoolReconciler,
// PolicyReconciler, ClaimReconciler and, with provisioning,
// ProvisionReconciler), adds the runnables of the Parts it returns (the
// pod sources, Leadership, InitialSync) and starts the manager. A pool's
// pods come from one of two watch plans, chosen per namespace
// (Options.PodWatchPlan): a watch of the pool's own, or one watch of every
// pod of the namespace shared by its served pools; a cluster-wide pod watch
// is never made. Package podsource says how, and in which lock order.
package controllers
