// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package scheduling picks, per pool and per request, the endpoint that should
// serve the request and an ordered list of fallbacks: filters narrow the
// candidates, weighted scorers rank them, a picker chooses; plugins are
// grouped into named profiles chosen per pool.
//
// A Scheduler is built from Options and an EndpointPickerConfig (the
// reference EPP's YAML shape; DefaultConfigText when none is given). Each
// InferencePool picks a profile with the annotation ProfileAnnotation, read
// on every request. One ScheduleDeferred call:
//
//  1. reads each endpoint's metrics once; a scrape older than
//     Options.MetricsStaleness makes the endpoint's load unknown;
//  2. runs the profile's filters (a subset filter always first), its scorers
//     (each 0..1, times its weight), and its picker — first over endpoints of
//     known load, then, only to fill what is left, over unknown ones;
//  3. at Result.Commit, lets plugins learn from the pick (the prefix-cache
//     scorer records the prompt's blocks in the primary endpoint's LRU).
//
// The scheduler filters, scores and picks only. The request's life
// (package requestcontrol) applies the pool's model rewrite before it asks
// (Request.TargetModel) and sheds a sheddable request (objective priority
// < 0) with a 429 when the pool is saturated by the rule of
// Options.SaturationAdmission, which AdmissionSaturated applies; the same
// thresholds are the saturation flow control asks of PoolSaturated,
// EndpointSaturated and EndpointStartsAtOnce.
//
// Plugins implement the extension points of package framework and see
// pools and endpoints through its read-only views; the built-in ones live
// in scheduling/plugins/..., registered by NewRegistry, and a plugin of
// another module joins them in a registry given as Options.Registry
// (poolpicker's command: app.WithPlugin; site-src/plugins.md). A config
// names plugins by their registered type.
//
// Guarantees: ScheduleDeferred and the saturation checks take no lock
// shared between pools, and ScheduleDeferred allocates once in steady state
// (the Result); plugin instances are shared
// by all pools and keep per-pool state keyed by pool, dropped when the pool
// or its endpoints leave the registry (the Scheduler is a
// datastore.Observer and tells framework.PoolObserver plugins); per-request
// state lives in a CycleState, never in package variables. The Scheduler
// starts no goroutine.
package scheduling
