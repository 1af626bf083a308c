// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"context"
	"errors"
	"math/rand/v2"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// Scheduler picks endpoints for a request in a pool; *scheduling.Scheduler
// satisfies it, and the controller uses nothing else of it.
type Scheduler interface {
	// PromptBytes is how many leading bytes of Request.Prompt the scheduler
	// reads at most; zero when it reads none. The server hands it no more
	// and only skims the rest of the body. Asked once, by New.
	PromptBytes() int
	// AdmissionSaturated reports whether pool is saturated by the rule
	// under which sheddable requests are refused, and why, in words for
	// the refusal; false for a pool without endpoints. Asked before a
	// sheddable request that flow control did not admit is scheduled; it
	// must read snapshots only, taking no lock shared between pools.
	AdmissionSaturated(pool *datastore.Pool) (saturated bool, why string)
	// ScheduleDeferred picks the endpoints for req in pool, req.TargetModel
	// already rewritten by the pool's rules. A
	// *scheduling.Error is answered with its HTTP code. What the scheduler
	// learns from the pick waits for Result.Commit, which the controller
	// calls once the answer is sent (Request.Sent), before req (and the
	// body its Prompt aliases) goes; then Result.ObserveResponse if the
	// model server reports them.
	ScheduleDeferred(ctx context.Context, pool *datastore.Pool, req *scheduling.Request) (*scheduling.Result, error)
}

// Options configure a Controller. The zero value is no flow control.
type Options struct {
	// FlowControl, when set, holds each request in its pool's queue while
	// the pool is saturated (or, with a waiting room, has no endpoint) and
	// releases it by priority band and flow. Nil: no flow control; a
	// saturated pool sheds sheddable requests only.
	FlowControl *flowcontrol.Controller
	// Rand returns uniformly random uint64s for the split of a model
	// rewrite between its weighted targets; it must be safe for concurrent
	// use. Nil: math/rand/v2.
	Rand func() uint64
}

// Controller runs the life of every request of one ext_proc server.
type Controller struct {
	sched Scheduler
	opts  Options
	// promptBytes is sched's PromptBytes, asked once.
	promptBytes int
	// flowHeader is FlowControl's flow header (lower case); empty when none.
	flowHeader string
}

// New returns a controller scheduling with sched.
func New(sched Scheduler, opts Options) (*Controller, error) {
	if sched == nil {
		return nil, errors.New("requestcontrol: a scheduler is required")
	}
	if opts.Rand == nil {
		opts.Rand = rand.Uint64
	}
	c := &Controller{sched: sched, opts: opts, promptBytes: max(sched.PromptBytes(), 0)}
	if opts.FlowControl != nil {
		c.flowHeader = opts.FlowControl.FlowHeader()
	}
	return c, nil
}

// PromptBytes is how many leading prompt bytes the scheduler reads; the
// body parser validates no more.
func (c *Controller) PromptBytes() int { return c.promptBytes }

// FlowHeader is the request header (lower case) whose value names a
// request's flow (Request.Flow); empty when flow control keys flows by
// objective.
func (c *Controller) FlowHeader() string { return c.flowHeader }
