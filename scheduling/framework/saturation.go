// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

// Saturation is the one rule of when an endpoint has no free slot: its
// waiting requests at or over QueueDepth, or its KV-cache use at or over
// KVCacheUtil. Everything that judges saturation judges by it: the
// scheduler's shedding of sheddable requests (on the candidates' scrapes),
// flow control's releases (on the scrape corrected by the picker's own
// counts since, Scheduler.EndpointSaturated) and the plugins
// (CycleState.Saturated). What differs between them is only what they know
// of the waiting requests and the KV-cache use.
type Saturation struct {
	// QueueDepth is the waiting requests at which an endpoint is saturated.
	QueueDepth int
	// KVCacheUtil is the KV-cache use (0..1) at which it is saturated.
	KVCacheUtil float64
}

// Load is an endpoint's load against the rule: the larger of its waiting
// requests over QueueDepth and its KV-cache use over KVCacheUtil. At least
// 1 exactly when Saturated.
func (s Saturation) Load(waiting int, kvCacheUse float64) float64 {
	return max(float64(waiting)/float64(s.QueueDepth), kvCacheUse/s.KVCacheUtil)
}

// Saturated reports whether an endpoint with waiting requests and
// kvCacheUse is saturated.
func (s Saturation) Saturated(waiting int, kvCacheUse float64) bool {
	return waiting >= s.QueueDepth || kvCacheUse >= s.KVCacheUtil
}
