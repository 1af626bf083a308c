// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"errors"

	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/flowcontrol"
)

// admit holds the stream's request in its pool's flow-control queue until
// it may be scheduled; the stream holds its answer meanwhile. done means the
// request was refused (answered 429 or 503) or its client went away.
func (st *stream) admit() (done bool, err error) {
	fc := st.s.opts.FlowControl
	priority, _ := st.pool.Policy().Priority(st.objective)
	flow := st.objective
	if st.s.flowHeader != "" {
		flow = st.flow
	}
	prev := st.state
	st.state = stateQueued
	t, err := fc.Admit(st.ctx, st.pool, flowcontrol.Request{ID: st.requestID, Flow: flow, Priority: priority, Bytes: int64(st.bodyBytes)})
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
