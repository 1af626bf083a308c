// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"fmt"
	"net/http"
	"time"
)

// Request is what the scheduler needs of one inference request; extproc
// fills it from the stream's headers and body.
type Request struct {
	// ID is the request's x-request-id, for logs.
	ID string
	// Model is the "model" field of the body as the client sent it; empty for
	// requests without a body (GET /v1/models), which any endpoint can serve.
	Model string
	// TargetModel is the model the request is sent as: Model after the
	// pool's rewrite rules, which the request's life applies before it is
	// scheduled (CycleState.TargetModel). Empty: Model.
	TargetModel string
	// ModelRewrite names the InferenceModelRewrite that chose TargetModel;
	// empty when none applied.
	ModelRewrite string
	// Objective is the x-gateway-inference-objective header, naming an
	// InferenceObjective of the pool; empty means priority 0.
	Objective string
	// Prompt is the bytes whose prefix the model servers may have cached:
	// extproc passes the raw JSON of the chat messages array or of the
	// completion prompt value. Only prefix equality across requests matters,
	// not the encoding. Nil when none. Only its first PromptBytes bytes (the
	// most any PromptReader plugin asks for) are read, so a caller may pass
	// just those. It may alias the request body; valid only during the
	// scheduling cycle (until Result.Commit when deferred): plugins hash it
	// and must not keep it (or a slice of it) after that.
	Prompt []byte
	// Subset, when not nil, restricts candidates to these "ip:port" addresses
	// (the gateway's subset hint); an empty non-nil subset leaves none.
	Subset []string
	// CandidateIPs, when not nil, restricts candidates to these pod IPs
	// (conformance-test header test-epp-endpoint-selection).
	CandidateIPs []string
	// Scores asks for Result.Scores (--emit-endpoint-scores); false leaves
	// it nil, so the pick path allocates nothing for it.
	Scores bool
}

// Result is the scheduler's decision as the post-pick plugins see it
// (PostPicker), through read-only views; the scheduler's caller gets its
// own result with the endpoints to send the request to.
type Result struct {
	// Endpoints are the primary endpoint then fallbacks, in order; never
	// empty.
	Endpoints []Endpoint
	// TargetModel is the model written into the body: Request.TargetModel,
	// else Request.Model.
	TargetModel string
	// ModelRewrite names the InferenceModelRewrite that chose TargetModel;
	// empty when none applied.
	ModelRewrite string
	// Profile names the scheduling profile that ran.
	Profile string
	// Priority is the request's priority from its InferenceObjective (0 when
	// none); below zero means sheddable.
	Priority int

	// prediction is what a post-picker predicted of the primary endpoint's
	// cached prompt tokens.
	prediction CachePrediction
}

// CachePredictionObserver hears how many prompt tokens the primary
// endpoint reported serving from its prefix cache, against what it
// predicted (Result.Predict).
type CachePredictionObserver interface {
	ObserveCachedTokens(p *CachePrediction, cachedTokens int)
}

// CachePrediction is a post-picker's belief about the primary endpoint's
// prefix cache for this request, checked when the server reports its
// cached tokens. The fields other than Observer and the Reported ones
// are the observer's own; Ref should hold a pointer (storing one costs no
// allocation).
type CachePrediction struct {
	Observer        CachePredictionObserver
	Ref             any
	PredictedTokens int
	PromptTokens    int
	Mark            uint64
	// LoadAtPick is the load the primary endpoint had ahead of this one
	// when it was picked (requests, weighed as the observer weighs load),
	// for an observer that learns what that load costs (ReportedTTFT).
	LoadAtPick float64
	// QueuedAtPick is the part of LoadAtPick beyond the most sequences
	// the endpoint's servers were seen running (0 when the observer does
	// not ask).
	QueuedAtPick float64
	// ReportedPromptTokens is the prompt's tokens as the server counted
	// them (the usage's prompt_tokens), set by the scheduler when it hands
	// the report to ObserveCachedTokens; zero when the server reported
	// none. The cached tokens are in the server's tokens too, so an
	// observer that predicted in its own estimate of tokens can scale.
	ReportedPromptTokens int
	// ReportedTTFT is the time from the request to the first byte of its
	// streamed response, set by the scheduler with the report; zero when
	// the response was not streamed.
	ReportedTTFT time.Duration
}

// Predict leaves p on the result for the server's report of cached tokens
// (ObserveCachedTokens); the first post-picker to predict wins, and it
// reports whether p was kept.
func (r *Result) Predict(p CachePrediction) bool {
	if r.prediction.Observer != nil || p.Observer == nil {
		return false
	}
	r.prediction = p
	return true
}

// Prediction returns what a post-picker left with Predict, for the
// scheduler to hand the server's report of cached tokens to (its
// Observer's ObserveCachedTokens); zero when none predicted.
func (r *Result) Prediction() CachePrediction { return r.prediction }

// Error is a scheduling failure that maps to an HTTP status for the client.
// errors.Is matches it against ErrShed and ErrNoEndpoints by Reason.
type Error struct {
	// Code is the HTTP status to answer: 429 when shed, 503 when no endpoint.
	Code int
	// Reason is a short machine-readable cause, e.g. "NoEligibleEndpoints".
	Reason string
	// Message says what happened in words an operator can act on.
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Message) }

// Is reports whether target is an *Error of the same Reason.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Reason == e.Reason
}

// Sentinels for errors.Is: every error NewNoEndpointsError and NewShedError
// return matches theirs.
var (
	ErrNoEndpoints = &Error{Code: http.StatusServiceUnavailable, Reason: "NoEligibleEndpoints", Message: "no eligible endpoint"}
	ErrShed        = &Error{Code: http.StatusTooManyRequests, Reason: "Shed", Message: "sheddable request refused under saturation"}
)

// NewNoEndpointsError returns the 503 error for a pool with no eligible
// endpoint.
func NewNoEndpointsError(format string, args ...any) *Error {
	return &Error{Code: ErrNoEndpoints.Code, Reason: ErrNoEndpoints.Reason, Message: fmt.Sprintf(format, args...)}
}

// NewShedError returns the 429 error for a sheddable request refused under
// saturation.
func NewShedError(format string, args ...any) *Error {
	return &Error{Code: ErrShed.Code, Reason: ErrShed.Reason, Message: fmt.Sprintf(format, args...)}
}
