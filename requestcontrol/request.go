// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// Request is one request's life, from its pick to its end. The protocol
// side fills the exported fields from the request's headers before Pick
// and calls the methods in the order the package doc gives; the zero
// value is not usable, Controller.Request makes one.
type Request struct {
	c *Controller

	// Pool is the pool the request is for; set before Pick.
	Pool *datastore.Pool
	// ID is the request's x-request-id, for the scheduler's logs.
	ID string
	// Objective names the request's InferenceObjective (its priority).
	Objective string
	// Flow is the value of the controller's FlowHeader, when it has one.
	Flow string
	// ModelRewrite is the model a request header asked the request be sent
	// as, overriding the body's; empty when none.
	ModelRewrite string
	// Subset limits the endpoints to those addresses (the gateway's subset
	// hint); nil: no limit.
	Subset []string
	// CandidateIPs limits the endpoints to those IPs (conformance tests).
	CandidateIPs []string
	// Bytes is the request body's size, charged to flow control's queue
	// while the request waits.
	Bytes int
	// Scores asks the scheduler for every scored endpoint's weighted total
	// (scheduling.Request.Scores, then Result.Scores).
	Scores bool

	// model and prompt are what the body said (SetBody).
	model  string
	prompt []byte

	res      *scheduling.Result  // the scheduler's answer, taught on Sent
	learn    bool                // res is to be committed on Sent
	ticket   *flowcontrol.Ticket // flow control's hold, told of the pick and the end
	lease    *datastore.Lease    // the request's in-flight count, from Commit to Finish
	finished bool
}

// Request starts a request's life under c.
func (c *Controller) Request() Request { return Request{c: c} }

// SetBody records the body's model and prompt. prompt may alias the body,
// which must stay unchanged until Sent.
func (r *Request) SetBody(model string, prompt []byte) { r.model, r.prompt = model, prompt }

// Model is the model the scheduler is asked for: the header's rewrite,
// else the body's.
func (r *Request) Model() string {
	if r.ModelRewrite != "" {
		return r.ModelRewrite
	}
	return r.model
}

// Waiter is the protocol side's part in a wait in flow control: Waiting
// is called before the request waits (the queue counts its body from
// then), Resumed after. Both run on the stream's goroutine.
type Waiter interface {
	Waiting()
	Resumed()
}

// Decision is what Pick decided.
type Decision struct {
	// Result is the scheduler's pick: its primary endpoint first, then
	// fallbacks. Nil when the scheduler was not asked, failed or returned no
	// endpoint.
	Result *scheduling.Result
	// Target is the model the request is sent as: Model after the pool's
	// rewrite rules. ModelRewrite names the InferenceModelRewrite that
	// chose it; empty when none applied.
	Target       string
	ModelRewrite string
	// Scheduled says the scheduler was asked; ScheduleTime is how long it
	// took.
	Scheduled    bool
	ScheduleTime time.Duration
}

// Refusal is a request refused by flow control or the scheduler, to be
// answered to the client with Code.
type Refusal struct {
	Code    int
	Reason  string
	Message string
}

func (e *Refusal) Error() string { return e.Reason + ": " + e.Message }

// Pick admits the request (flow control, else the shedding of a sheddable
// request from a saturated pool), applies the pool's model rewrite,
// schedules it and, with per-endpoint queues, admits it to the endpoint it
// was picked for. The error is a *Refusal, or the context's error when the
// client went away meanwhile. Whatever it returns, Sent must follow once
// the answer (the decision or the refusal) is sent.
func (r *Request) Pick(ctx context.Context, w Waiter) (d Decision, err error) {
	sreq := &scheduling.Request{ID: r.ID, Objective: r.Objective, Subset: r.Subset, CandidateIPs: r.CandidateIPs,
		Scores: r.Scores, Model: r.Model(), Prompt: r.prompt}
	perEndpoint, admitted := false, false
	if fc := r.c.opts.FlowControl; fc != nil {
		if err := r.awaitEndpoints(ctx, w); err != nil {
			return d, err
		}
		perEndpoint = fc.PerEndpoint()
		if !perEndpoint {
			// Released when the pool has a free slot, then scheduled.
			if err := r.admit(ctx, w, nil, 0); err != nil {
				return d, err
			}
		}
		// Released against the pool's saturation, as flow control counts
		// it: not shed again on the scrapes alone, which lag those counts.
		admitted = true
	}
	sreq.TargetModel, sreq.ModelRewrite = rewriteModel(r.Pool.Policy(), sreq.Model, r.c.opts.Rand)
	start := time.Now()
	if r.Pool.Endpoints().Len() > 0 {
		// The first request after an idle spell has the scraper refresh the
		// pool's servers; this one is picked on what is known meanwhile.
		r.Pool.NoteRequest(start)
	}
	res, err := r.schedule(ctx, sreq, admitted)
	d.Scheduled, d.ScheduleTime = true, time.Since(start)
	// Learning from the pick waits until the answer is sent (and before a
	// pooled body that the prompt may alias is reused); a request flow
	// control refused went nowhere and teaches nothing.
	r.res, r.learn = res, true
	if err != nil {
		var se *scheduling.Error
		if errors.As(err, &se) {
			return d, &Refusal{Code: se.Code, Reason: se.Reason, Message: se.Message}
		}
		if ctx.Err() != nil {
			return d, ctx.Err()
		}
		return d, &Refusal{Code: http.StatusServiceUnavailable, Reason: "SchedulingFailed", Message: err.Error()}
	}
	if res == nil || len(res.Endpoints) == 0 {
		return d, &Refusal{Code: http.StatusServiceUnavailable, Reason: "NoEligibleEndpoints", Message: "the scheduler returned no endpoint for pool " + r.Pool.Key.String()}
	}
	d.Result = res
	if perEndpoint {
		if err := r.admit(ctx, w, res, affinity(sreq.TargetModel, sreq.Prompt)); err != nil {
			r.learn = false
			return d, err
		}
	}
	d.Target, d.ModelRewrite = sreq.TargetModel, sreq.ModelRewrite
	return d, nil
}

// schedule sheds req, when it is sheddable, was not admitted by flow
// control and the scheduler finds its pool saturated (a 429
// *scheduling.Error), else asks the scheduler to pick.
func (r *Request) schedule(ctx context.Context, req *scheduling.Request, admitted bool) (*scheduling.Result, error) {
	if !admitted {
		if priority, _ := r.Pool.Policy().Priority(req.Objective); priority < 0 {
			if saturated, why := r.c.sched.AdmissionSaturated(r.Pool); saturated {
				return nil, scheduling.NewShedError("pool %s is saturated (%s); request of objective %q (priority %d) is sheddable",
					r.Pool.Key, why, req.Objective, priority)
			}
		}
	}
	return r.c.sched.ScheduleDeferred(ctx, r.Pool, req)
}

// Commit counts the request on its primary endpoint as the decision
// leaves, and lets flow control's queue go on; Finish takes the count
// down once.
func (r *Request) Commit() {
	r.lease = r.Pool.Acquire(r.res.Endpoints[0])
	r.ticket.Picked()
}

// Sent follows Pick once the answer is sent: the scheduler learns from its
// pick (a refused request teaches nothing) and flow control's queue goes
// on, whether or not the pick succeeded.
func (r *Request) Sent() {
	if r.learn {
		r.res.Commit()
	}
	r.ticket.Picked()
}

// Served moves the in-flight count to the endpoint at address that
// actually served the request, when the gateway reports a fallback.
func (r *Request) Served(address string) {
	if r.finished || r.lease == nil || address == r.lease.Endpoint().Address {
		return
	}
	if e, ok := r.Pool.Endpoints().Get(address); ok {
		r.lease.Move(e)
	}
}

// Endpoint is the endpoint the request is counted on, or was counted on
// last once finished; nil before Commit.
func (r *Request) Endpoint() *datastore.Endpoint { return r.lease.Endpoint() }

// Finished says Finish was called.
func (r *Request) Finished() bool { return r.finished }

// Finish ends the request's accounting, once: its in-flight count and its
// hold on flow control. Later calls do nothing.
func (r *Request) Finish() {
	if r.finished {
		return
	}
	r.finished = true
	r.lease.Release()
	r.ticket.Done()
}

// ObserveResponse tells the scheduler what the model server reported of
// its cached prompt tokens, and the response's time to its first byte
// (ttft; 0 when not streamed), after Finish of a completed response.
func (r *Request) ObserveResponse(cached, prompt int, ttft time.Duration) {
	if r.lease != nil {
		r.res.ObserveResponse(cached, prompt, ttft)
	}
}
