// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import "context"

// TypedName identifies a plugin instance: its registered type and the
// instance name a profile refers to (the type when the config gives none).
type TypedName struct {
	Type string
	Name string
}

func (t TypedName) String() string {
	if t.Name == t.Type {
		return t.Type
	}
	return t.Name + "/" + t.Type
}

// Plugin is anything a profile can list. A plugin serves each extension
// point (Filter, Scorer, Picker, PostPicker) whose interface it implements;
// keep to one job per plugin. One instance is shared by every profile and
// every pool, so plugins keep per-pool state keyed by pool and per-request
// state in the CycleState. A plugin that also implements PoolObserver
// hears of endpoints and pools that leave, to drop what it keeps for them.
type Plugin interface {
	TypedName() TypedName
}

// PoolObserver is implemented by plugins that keep state per pool or per
// endpoint: the scheduler tells them, synchronously and in order per pool,
// of endpoints that came and went and of pools that left. It must return
// quickly.
type PoolObserver interface {
	// EndpointsChanged is called after the pool's endpoint set was swapped.
	EndpointsChanged(pool Pool, added, removed []Endpoint)
	// PoolRemoved is called after the pool left the registry.
	PoolRemoved(pool Pool)
}

// Candidate is one endpoint considered in a scheduling cycle.
type Candidate struct {
	Endpoint Endpoint
	// Metrics is the endpoint's latest scrape when it is fresh; IsZero when
	// the endpoint's load is unknown (never scraped, or staler than the
	// scheduler's metrics staleness). Scorers treat that as unknown, never
	// as zero.
	Metrics Metrics
	// Index is the endpoint's position in CycleState.Endpoints, stable
	// while filters reorder and drop candidates: a plugin may keep
	// per-endpoint state in a slice aligned with that snapshot.
	Index int
	// Held is the requests flow control holds in the picker for the
	// endpoint, of the request's priority or higher: requests scheduled
	// there that wait for one of its slots, which this request would wait
	// behind. They are in neither InFlight nor the scrape; the load scorers
	// add them. Zero without flow control.
	Held int64
}

// Known reports whether the candidate's load is known.
func (c *Candidate) Known() bool { return !c.Metrics.IsZero() }

// Filter narrows the candidates.
type Filter interface {
	Plugin
	// Filter returns the candidates that may serve req, in their order. It
	// may compact candidates in place and return a prefix of it. Its
	// status says why: nil when it dropped none, or none it need explain;
	// Unschedulable with the reason it dropped candidates (the scheduler
	// goes on with those returned, and answers 503 with the reason when
	// none are left); Failed when it could not decide, which refuses the
	// request with a 503 naming the plugin and the reason.
	Filter(ctx context.Context, cs *CycleState, req *Request, candidates []Candidate) ([]Candidate, *Status)
}

// Scorer ranks candidates; the profile multiplies its scores by its weight.
type Scorer interface {
	Plugin
	// Score writes into scores[i] a value in [0,1] for candidates[i], higher
	// meaning better; len(scores) == len(candidates) and scores start at 0.
	// Values outside [0,1] are clamped, NaN counts as 0. A non-nil status
	// says the scorer could not score this request: its scores count 0
	// for every candidate (a scorer ranks, it does not exclude), and the
	// status shows in the decision and the logs.
	Score(ctx context.Context, cs *CycleState, req *Request, candidates []Candidate, scores []float64) *Status
}

// Picker chooses endpoints from scored candidates.
type Picker interface {
	Plugin
	// Pick appends to picked the indexes into candidates of up to n distinct
	// candidates, the one to use first first, and returns it. scores are the
	// weighted totals of the profile's scorers.
	Pick(ctx context.Context, cs *CycleState, req *Request, candidates []Candidate, scores []float64, n int, picked []int) []int
}

// EndpointLimiter is implemented by pickers whose config caps how many
// endpoints a result holds (upstream's maxNumOfEndpoints); zero or less
// means no cap of the picker's own.
type EndpointLimiter interface {
	MaxEndpoints() int
}

// PostPicker hears of the decision after a successful pick, when the
// scheduler's caller commits it (once the answer is on its way): the place
// for a plugin to learn from what it chose, off the request's latency
// path. result views the endpoints picked; Result.Predict leaves a
// prediction for the server's report of cached tokens.
type PostPicker interface {
	Plugin
	PostPick(ctx context.Context, cs *CycleState, req *Request, result *Result)
}

// PromptReader is implemented by every plugin that reads Request.Prompt.
// PromptBytes is how many of its leading bytes the plugin reads at most;
// the scheduler reports the largest over its plugins to its caller, which
// may then hand over only that much of the prompt (the ext_proc server
// validates just that much and skims the rest of the body). A plugin that
// reads the prompt without implementing it gets none.
type PromptReader interface {
	PromptBytes() int
}

// StateKey names a value a plugin keeps in a CycleState; use the plugin's
// type and instance name, so that no two instances collide.
type StateKey string

type stateEntry struct {
	key   StateKey
	value any
	cycle uint64
}

// CycleState carries what one scheduling cycle knows and what plugins hand
// to each other within it (a scorer's prompt hashes, read again after the
// pick). It is owned by one scheduling cycle at a time and may be recycled
// afterwards, so plugins must not keep it; nothing about a request survives
// in package variables.
type CycleState struct {
	// Pool is the pool being scheduled.
	Pool Pool
	// TargetModel is the request's model after the pool's rewrite rules.
	TargetModel string
	// Priority is the request's priority from its InferenceObjective.
	Priority int
	// Endpoints is the pool's endpoint snapshot the cycle schedules from.
	Endpoints EndpointSet

	cycle      uint64
	entries    []stateEntry
	rand       func() uint64
	saturation Saturation
}

// NewCycleState returns a state ready for one cycle over pool's current
// endpoints, as a scheduler prepares it; rand must be safe for concurrent
// use. Schedulers recycle states with Begin; plugin tests use this (or
// package frameworktest).
func NewCycleState(pool Pool, sat Saturation, rand func() uint64) *CycleState {
	cs := &CycleState{}
	cs.Begin(pool, sat, rand)
	cs.Endpoints = pool.Endpoints()
	return cs
}

// Begin readies a recycled state for a new cycle over pool: what earlier
// cycles wrote is no longer Read, only Reuse'd. The caller sets Endpoints,
// TargetModel and Priority.
func (cs *CycleState) Begin(pool Pool, sat Saturation, rand func() uint64) {
	cs.cycle++
	cs.Pool = pool
	cs.TargetModel = ""
	cs.Priority = 0
	cs.saturation = sat
	cs.rand = rand
}

// End drops the cycle's references to request data, so a recycled state
// pins nothing.
func (cs *CycleState) End() {
	cs.Pool = nil
	cs.Endpoints = nil
	cs.TargetModel = ""
}

// Write stores v under key for the rest of this cycle.
func (cs *CycleState) Write(key StateKey, v any) {
	for i := range cs.entries {
		if cs.entries[i].key == key {
			cs.entries[i].value = v
			cs.entries[i].cycle = cs.cycle
			return
		}
	}
	cs.entries = append(cs.entries, stateEntry{key: key, value: v, cycle: cs.cycle})
}

// Read returns what was written under key in this cycle.
func (cs *CycleState) Read(key StateKey) (any, bool) {
	for i := range cs.entries {
		if cs.entries[i].key == key && cs.entries[i].cycle == cs.cycle {
			return cs.entries[i].value, true
		}
	}
	return nil, false
}

// Reuse returns what was written under key in an earlier cycle of this
// recycled state, or nil: a plugin's buffers to reset and write again, so a
// steady stream of requests does not allocate.
func (cs *CycleState) Reuse(key StateKey) any {
	for i := range cs.entries {
		if cs.entries[i].key == key {
			return cs.entries[i].value
		}
	}
	return nil
}

// Saturated reports whether the candidate's known load is saturated by the
// scheduler's rule (Saturation); false when its load is unknown.
func (cs *CycleState) Saturated(c *Candidate) bool {
	m := c.Metrics
	return !m.IsZero() && cs.saturation.Saturated(m.WaitingRequests(), m.KVCacheUsage())
}

// Saturation is the scheduler's rule of saturation, for plugins that weigh
// load against it.
func (cs *CycleState) Saturation() Saturation { return cs.saturation }

// Rand returns a uniformly random uint64 from the scheduler's source, for
// tie-breaks and weighted choices.
func (cs *CycleState) Rand() uint64 { return cs.rand() }

// RandFloat returns a uniform float64 in [0,1) from the scheduler's source.
func (cs *CycleState) RandFloat() float64 {
	return float64(cs.rand()>>11) / (1 << 53)
}

// RandN returns a uniform int in [0,n), n > 0, from the scheduler's source.
func (cs *CycleState) RandN(n int) int {
	return int(cs.rand() % uint64(n))
}
