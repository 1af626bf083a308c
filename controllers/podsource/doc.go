// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package podsource feeds each served InferencePool its pods: it runs the
// pod watches (a watch of the pool's own, or one watch of its namespace
// shared by the namespace's pools) and publishes each pool's endpoints into
// the datastore.
//
// The pod-event path: a pod event arrives on a watch's protobuf stream,
// which the lean reflector of internal/podwatch decodes and strips to a
// podwatch.Pod on the watch's own goroutine; after each burst the watch
// hands its pods to its sink: a pool's own watch (poolWatch, the per-pool
// plan) publishes them all, a namespace's watch (namespaceWatch, nswatch.go, the namespace plan)
// filters them by each subscribed pool's selector. Either way the pool's
// servedPool.update publishes them with datastore.Pool.SetPods, whose
// observers (scheduler, flow control, scraper) see the new endpoint set.
//
// Which plan a namespace is on is decided in plan.go (Options.Plan and,
// for PlanAuto, NamespaceWatchThreshold). A selector change or a plan
// switch starts a new source for the pool, whose first list replaces the
// endpoint set in one swap before the old source stops.
//
// Lock order, for everything from here to the scraper:
//
//	Sources.mu
//	  → namespaceWatch.mu
//	    → a podwatch.Watch's view lock (EachPod) or servedPool.mu
//	      → the datastore's locks (Pool.SetPods and its observers: the
//	        scheduler, flow control and the scraper, which take only their
//	        own locks and never call back here)
//
// A source is never stopped with a servedPool's or a namespaceWatch's lock
// held: a subscription leaves its namespace's watch under Sources.mu and
// that watch's lock. The callbacks of Options come below these locks:
// CountServable under Sources.mu, Changed under a servedPool's, Events
// under a namespaceWatch's at most; none may call back into Sources or wait
// on anything that does.
package podsource
