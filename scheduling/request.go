package scheduling

import (
	"fmt"
	"net/http"

	"github.com/poolpicker/poolpicker/datastore"
)

// Request is what the scheduler needs of one inference request; extproc
// fills it from the stream's headers and body.
type Request struct {
	// ID is the request's x-request-id, for logs.
	ID string
	// Model is the "model" field of the body as the client sent it; empty for
	// requests without a body (GET /v1/models), which any endpoint can serve.
	Model string
	// Objective is the x-gateway-inference-objective header, naming an
	// InferenceObjective of the pool; empty means priority 0.
	Objective string
	// Prompt is the bytes whose prefix the model servers may have cached:
	// extproc passes the raw JSON of the chat messages array or of the
	// completion prompt value. Only prefix equality across requests matters,
	// not the encoding. Nil when none. Only its first Scheduler.PromptBytes
	// bytes are read, so a caller may pass just those. It may alias the
	// request body; valid only during Schedule (or until Result.Commit after
	// ScheduleDeferred): plugins hash it and must not keep it (or a slice of
	// it) after that.
	Prompt []byte
	// Subset, when not nil, restricts candidates to these "ip:port" addresses
	// (the gateway's subset hint); an empty non-nil subset leaves none.
	Subset []string
	// CandidateIPs, when not nil, restricts candidates to these pod IPs
	// (conformance-test header test-epp-endpoint-selection).
	CandidateIPs []string
}

// Result is the scheduler's decision.
type Result struct {
	// Endpoints are the primary endpoint then fallbacks, in order; never empty
	// when the error is nil.
	Endpoints []*datastore.Endpoint
	// TargetModel is the model to write into the body: Model after the pool's
	// rewrite rules, equal to Model when none applied.
	TargetModel string
	// ModelRewrite names the InferenceModelRewrite that chose TargetModel;
	// empty when none applied.
	ModelRewrite string
	// Profile names the scheduling profile that ran.
	Profile string
	// Priority is the request's priority from its InferenceObjective (0 when
	// none); below zero means sheddable.
	Priority int

	// pending is the post-pick step ScheduleDeferred left to Commit.
	pending *pendingCommit
	// feedback is the prefix index's prediction for the primary endpoint,
	// set at post-pick.
	feedback prefixFeedback
}

// ObserveCachedTokens tells the scheduler how many prompt tokens the
// primary endpoint reported it served from its prefix cache (the usage's
// prompt_tokens_details.cached_tokens), after Commit. When it had fewer
// than the prefix index predicted, the index forgets what it believed that
// endpoint held longer ago than the blocks it lost. Call it at most once,
// only with a count the server reported; a nil Result ignores it.
func (r *Result) ObserveCachedTokens(cachedTokens int) {
	if r == nil {
		return
	}
	r.feedback.observe(cachedTokens)
	r.feedback = prefixFeedback{}
}

// PrefixAgreement is how the prefix index's predictions compared with the
// cached tokens the servers reported (Result.ObserveCachedTokens), summed
// over the scheduler's prefix-cache scorers since it started.
type PrefixAgreement struct {
	// Observed is the reports received; OverPredicted those with fewer
	// cached tokens than predicted (beyond a block's rounding).
	Observed, OverPredicted int64
	// PredictedTokens is the prompt tokens the index predicted cached;
	// ConfirmedTokens the part of them the servers reported cached.
	PredictedTokens, ConfirmedTokens int64
}

// Error is a scheduling failure that maps to an HTTP status for the client.
type Error struct {
	// Code is the HTTP status to answer: 429 when shed, 503 when no endpoint.
	Code int
	// Reason is a short machine-readable cause, e.g. "NoEligibleEndpoints".
	Reason string
	// Message says what happened in words an operator can act on.
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Message) }

// ErrNoEndpoints returns the 503 error for a pool with no eligible endpoint.
func ErrNoEndpoints(format string, args ...any) *Error {
	return &Error{Code: http.StatusServiceUnavailable, Reason: "NoEligibleEndpoints", Message: fmt.Sprintf(format, args...)}
}

// ErrShed returns the 429 error for a sheddable request refused under saturation.
func ErrShed(format string, args ...any) *Error {
	return &Error{Code: http.StatusTooManyRequests, Reason: "Shed", Message: fmt.Sprintf(format, args...)}
}
