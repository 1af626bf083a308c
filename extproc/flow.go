// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"errors"
	"hash/maphash"

	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// awaitEndpoints holds the stream's request in its pool's waiting room
// while the pool has no ready endpoint, before the scheduler is asked. done
// means the request was refused (503) or its client went away.
func (st *stream) awaitEndpoints() (done bool, err error) {
	if st.pool.Endpoints().Len() > 0 {
		return false, nil
	}
	prev := st.state
	st.state = stateQueued
	st.releaseHeld() // the waiting room counts the body against --flow-control-max-queued-bytes
	err = st.s.opts.FlowControl.AwaitEndpoints(st.ctx, st.pool, st.flowRequest())
	st.state = prev
	if err != nil {
		return true, st.refuse(err)
	}
	return false, nil
}

// admit holds the stream's request in its pool's flow-control queue. With
// per-endpoint queues (res, the scheduler's pick), until the endpoint it
// prefers or an idle one may take it, and puts that endpoint first in res;
// else (res nil, the scheduler asked after) until any endpoint of the pool
// has a free slot. affinity is the request's flowcontrol.Request.Affinity.
// The stream holds its answer meanwhile. done means the request was
// refused (answered 429 or 503) or its client went away.
func (st *stream) admit(res *scheduling.Result, affinity uint64) (done bool, err error) {
	req := st.flowRequest()
	if res != nil {
		req.Endpoints, req.Affinity = res.Endpoints, affinity
		// A request that waits teaches the scheduler its pick at once: the
		// requests of the same prefix scheduled meanwhile then follow it to
		// the endpoint it waits for, instead of scattering the prefix.
		req.Queued = res.Commit
	}
	prev := st.state
	st.state = stateQueued
	st.releaseHeld() // the queue counts the body against --flow-control-max-queued-bytes
	t, err := st.s.opts.FlowControl.Admit(st.ctx, st.pool, req)
	st.state = prev
	if err != nil {
		return true, st.refuse(err)
	}
	st.ticket = t
	if to := t.Endpoint(); res != nil && to != nil && to.Key() != res.Endpoints[0].Key() {
		res.Endpoints = firstOf(res.Endpoints, to)
	}
	return false, nil
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

func (st *stream) flowRequest() flowcontrol.Request {
	priority, _ := st.pool.Policy().Priority(st.objective)
	flow := st.objective
	if st.s.flowHeader != "" {
		flow = st.flow
	}
	return flowcontrol.Request{ID: st.requestID, Flow: flow, Priority: priority, Bytes: int64(st.bodyBytes)}
}

// refuse answers a request flow control refused, or ends the stream of one
// whose client went away.
func (st *stream) refuse(err error) error {
	var fe *flowcontrol.Error
	if errors.As(err, &fe) {
		return st.fail(&httpError{code: fe.Code, reason: fe.Reason, msg: fe.Message})
	}
	return status.FromContextError(err).Err()
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
