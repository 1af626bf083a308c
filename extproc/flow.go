// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"errors"

	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// admit holds the stream's request in its pool's flow-control queue until
// it may be scheduled; the stream holds its answer meanwhile. done means the
// request was refused (answered 429 or 503) or its client went away.
func (st *stream) admit(sreq *scheduling.Request) (done bool, err error) {
	fc := st.s.opts.FlowControl
	priority, _ := st.pool.Policy().Priority(st.objective)
	flow := st.objective
	if st.s.flowHeader != "" {
		flow = st.flow
	}
	prev := st.state
	st.state = stateQueued
	t, err := fc.Admit(st.ctx, st.pool, flowcontrol.Request{ID: st.requestID, Flow: flow, Priority: priority, Bytes: int64(st.bodyBytes),
		Home: func() *datastore.Endpoint { return st.home(sreq) }})
	st.state = prev
	if err != nil {
		var fe *flowcontrol.Error
		if errors.As(err, &fe) {
			return true, st.fail(&httpError{code: fe.Code, reason: fe.Reason, msg: fe.Message})
		}
		return true, status.FromContextError(err).Err()
	}
	st.ticket = t
	return false, nil
}

// home is the endpoint sreq would go to were every endpoint free: a pick
// that is neither shed nor committed (the prefix index learns nothing of
// it); nil when the pick fails.
func (st *stream) home(sreq *scheduling.Request) *datastore.Endpoint {
	probe := *sreq
	probe.Admitted, probe.Released, probe.Scores = true, false, false
	res, err := st.s.sched.ScheduleDeferred(st.ctx, st.pool, &probe)
	if err != nil || len(res.Endpoints) == 0 {
		return nil
	}
	return res.Endpoints[0]
}
