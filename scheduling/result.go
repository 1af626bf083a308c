// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Result is the scheduler's decision, for its caller: the endpoints to
// send the request to, which the caller counts the request against. The
// post-pick plugins see it through a read-only view (framework.Result).
type Result struct {
	// Endpoints are the primary endpoint then fallbacks, in order; never empty
	// when the error is nil.
	Endpoints []*datastore.Endpoint
	// Profile names the scheduling profile that ran.
	Profile string
	// Priority is the request's priority from its InferenceObjective (0 when
	// none); below zero means sheddable.
	Priority int
	// Scores maps the "ip:port" of every endpoint the scorers scored (every
	// candidate the filters left, picked or not) to its total: the sum of
	// each scorer's score (0..1) times its weight. Only when Request.Scores.
	Scores map[string]float64
	// Statuses are what the profile's filters and scorers said when it was
	// not a plain success (why a filter dropped candidates, why a scorer
	// could not score), in the order they ran; nil when every one
	// succeeded.
	Statuses []PluginStatus

	// pending is the post-pick step left to Commit.
	pending *pendingCommit
	// prediction is what a post-pick plugin predicted of the primary
	// endpoint's prefix cache (framework.Result.Predict).
	prediction framework.CachePrediction
}

// Commit runs what the scheduler deferred (the post-pick plugins) and lets
// it recycle the cycle's state. The caller of a scheduler calls it once it
// has answered; only the first call does anything, a nil Result or one
// with nothing deferred is a no-op. Not safe for concurrent use.
func (r *Result) Commit() {
	if r == nil || r.pending == nil {
		return
	}
	p := r.pending
	r.pending = nil
	p.commit(r)
}

// ObserveResponse tells the post-pick plugin that predicted the primary
// endpoint's prefix cache how many prompt tokens the endpoint reported
// serving from it (the usage's prompt_tokens_details.cached_tokens) of the
// prompt's promptTokens (the usage's prompt_tokens; 0 when not reported),
// and the response's time to its first byte (ttft; 0 when it was not
// streamed), after Commit. Call it at most once, only with a count the
// server reported; a nil Result ignores it.
func (r *Result) ObserveResponse(cachedTokens, promptTokens int, ttft time.Duration) {
	if r == nil || r.prediction.Observer == nil {
		return
	}
	p := r.prediction
	r.prediction = framework.CachePrediction{}
	p.ReportedPromptTokens = max(promptTokens, 0)
	p.ReportedTTFT = max(ttft, 0)
	p.Observer.ObserveCachedTokens(&p, cachedTokens)
}
