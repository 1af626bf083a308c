// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"context"
	"errors"
	"hash/maphash"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// awaitEndpoints holds the request in its pool's waiting room while the
// pool has no ready endpoint, before the scheduler is asked. An error means
// the request was refused (a *Refusal, 503) or its client went away.
func (r *Request) awaitEndpoints(ctx context.Context, w Waiter) error {
	if r.Pool.Endpoints().Len() > 0 {
		return nil
	}
	w.Waiting() // the waiting room counts the body against --flow-control-max-queued-bytes
	err := r.c.opts.FlowControl.AwaitEndpoints(ctx, r.Pool, r.flowRequest())
	w.Resumed()
	return refusal(err)
}

// admit holds the request in its pool's flow-control queue. With
// per-endpoint queues (res, the scheduler's pick), until the endpoint it
// prefers or an idle one may take it, and puts that endpoint first in res;
// else (res nil, the scheduler asked after) until any endpoint of the pool
// has a free slot. affinity is the request's flowcontrol.Request.Affinity.
// The stream holds its answer meanwhile. An error means the request was
// refused (a *Refusal, 429 or 503) or its client went away.
func (r *Request) admit(ctx context.Context, w Waiter, res *scheduling.Result, affinity uint64) error {
	req := r.flowRequest()
	if res != nil {
		req.Endpoints, req.Affinity = res.Endpoints, affinity
		// A request that waits teaches the scheduler its pick at once: the
		// requests of the same prefix scheduled meanwhile then follow it to
		// the endpoint it waits for, instead of scattering the prefix.
		req.Queued = res.Commit
	}
	w.Waiting() // the queue counts the body against --flow-control-max-queued-bytes
	t, err := r.c.opts.FlowControl.Admit(ctx, r.Pool, req)
	w.Resumed()
	if err != nil {
		return refusal(err)
	}
	r.ticket = t
	if to := t.Endpoint(); res != nil && to != nil && to.Key() != res.Endpoints[0].Key() {
		res.Endpoints = firstOf(res.Endpoints, to)
	}
	return nil
}

// refusal is flow control's refusal as a *Refusal; other errors (the
// client went away) as they are.
func refusal(err error) error {
	var fe *flowcontrol.Error
	if errors.As(err, &fe) {
		return &Refusal{Code: fe.Code, Reason: fe.Reason, Message: fe.Message}
	}
	return err
}

// affinityPromptBytes is how much of a prompt names its prefix for flow
// control's Affinity: four of the prefix scorer's default hash blocks.
const affinityPromptBytes = 256

// affinitySeed keys the Affinity hashes; they never leave the process.
var affinitySeed = maphash.MakeSeed()

// affinity is flowcontrol.Request.Affinity of a prompt for model: a hash of
// both, over the prompt's first affinityPromptBytes; zero without a prompt.
func affinity(model string, prompt []byte) uint64 {
	if len(prompt) == 0 {
		return 0
	}
	var h maphash.Hash
	h.SetSeed(affinitySeed)
	h.WriteString(model)
	h.WriteByte(0)
	h.Write(prompt[:min(len(prompt), affinityPromptBytes)])
	return max(h.Sum64(), 1)
}

func (r *Request) flowRequest() flowcontrol.Request {
	priority, _ := r.Pool.Policy().Priority(r.Objective)
	flow := r.Objective
	if r.c.flowHeader != "" {
		flow = r.Flow
	}
	return flowcontrol.Request{ID: r.ID, Flow: flow, Priority: priority, Bytes: int64(r.Bytes)}
}

// firstOf is eps with e first, the others after it in their order, as
// many as eps held (the last dropped when e was not among them).
func firstOf(eps []*datastore.Endpoint, e *datastore.Endpoint) []*datastore.Endpoint {
	out := make([]*datastore.Endpoint, 0, len(eps))
	out = append(out, e)
	for _, x := range eps {
		if len(out) < len(eps) && x.Key() != e.Key() {
			out = append(out, x)
		}
	}
	return out
}
