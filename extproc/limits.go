// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits a stream can run into, as the limit label of
// poolpicker_extproc_limit_rejections_total spells them.
const (
	limitConcurrentStreams = "concurrent_streams"
	limitHeldBodyBytes     = "held_request_body_bytes"
	limitBodyStart         = "request_body_start_timeout"
	limitBody              = "request_body_timeout"
	limitResponseIdle      = "response_idle_timeout"
)

// limits is the process-wide accounting every stream shares: open streams
// and held request-body bytes, against their bounds, and what was refused.
type limits struct {
	maxStreams   int64
	maxHeldBytes int64
	streams      atomic.Int64
	heldBytes    atomic.Int64
	rejections   *prometheus.CounterVec
	panics       prometheus.Counter
}

func newLimits(reg prometheus.Registerer, o *Options) (*limits, error) {
	l := &limits{maxStreams: int64(o.MaxConcurrentStreams), maxHeldBytes: o.MaxHeldRequestBodyBytes}
	l.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poolpicker_extproc_limit_rejections_total",
		Help: "Streams refused or ended by a limit: concurrent_streams, held_request_body_bytes, request_body_start_timeout, request_body_timeout, response_idle_timeout.",
	}, []string{"limit"})
	for _, v := range []string{limitConcurrentStreams, limitHeldBodyBytes, limitBodyStart, limitBody, limitResponseIdle} {
		l.rejections.WithLabelValues(v) // every limit is listed, at zero until it refuses
	}
	l.panics = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "poolpicker_extproc_panics_total",
		Help: "Panics recovered while serving a stream (or a health call); each ended that stream or call with INTERNAL, and the process went on.",
	})
	streams := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "poolpicker_extproc_streams",
		Help: "ext_proc streams open now (bounded by --max-concurrent-streams).",
	}, func() float64 { return float64(l.streams.Load()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "poolpicker_extproc_held_request_body_bytes",
		Help: "Request-body bytes held by all streams now, as counted against --max-held-request-body-bytes.",
	}, func() float64 { return float64(l.heldBytes.Load()) })
	for _, c := range []prometheus.Collector{l.rejections, l.panics, streams, held} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// admit takes a stream slot, or says why not.
func (l *limits) admit() error {
	n := l.streams.Add(1)
	if l.maxStreams > 0 && n > l.maxStreams {
		l.streams.Add(-1)
		l.rejections.WithLabelValues(limitConcurrentStreams).Inc()
		return status.Errorf(codes.ResourceExhausted, "ext_proc: %d streams are open, the limit set by --max-concurrent-streams; retry later or raise the limit", l.maxStreams)
	}
	return nil
}

func (l *limits) leave() { l.streams.Add(-1) }

// hold charges n more held body bytes to the process budget; false means
// the budget is spent and nothing was charged.
func (l *limits) hold(n int) bool {
	if l.maxHeldBytes <= 0 {
		l.heldBytes.Add(int64(n))
		return true
	}
	// Compare and swap, so that the gauge never shows more than the budget,
	// not even for the instant between charging and giving back.
	for {
		cur := l.heldBytes.Load()
		if cur+int64(n) > l.maxHeldBytes {
			return false
		}
		if l.heldBytes.CompareAndSwap(cur, cur+int64(n)) {
			return true
		}
	}
}

func (l *limits) release(n int) {
	if n != 0 {
		l.heldBytes.Add(-int64(n))
	}
}

func (l *limits) budgetError() *httpError {
	l.rejections.WithLabelValues(limitHeldBodyBytes).Inc()
	return &httpError{code: http.StatusServiceUnavailable, reason: "BodyBudgetExhausted",
		msg: "the endpoint picker holds " + strconv.FormatInt(l.maxHeldBytes, 10) + " bytes of request bodies, the limit set by --max-held-request-body-bytes; retry later"}
}

// recovered turns a recovered panic value into the INTERNAL status its
// stream (or call) ends with, logging it once with the stack.
func (l *limits) recovered(log logr.Logger, r any, where string, kv ...any) error {
	l.panics.Inc()
	log.Error(fmt.Errorf("panic: %v", r), "recovered a panic; only this stream ends", append(kv, "where", where, "stack", string(debug.Stack()))...)
	return status.Errorf(codes.Internal, "endpoint picker: internal error serving this stream (%s); the request was not routed", where)
}

// unaryRecovery and streamRecovery end a call whose handler panicked with
// INTERNAL instead of the process: the stream handler guards its own loop
// (with pool and request in the log); this catches the rest, the health
// service included.
func (s *Server) unaryRecovery(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.limits.recovered(s.log, r, "handler", "method", info.FullMethod)
		}
	}()
	return h(ctx, req)
}

func (s *Server) streamRecovery(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.limits.recovered(s.log, r, "handler", "method", info.FullMethod)
		}
	}()
	return h(srv, ss)
}

// Stream deadlines (see Options): which applies follows the state.

// deadlineDue is when the current state's deadline falls, false if it has
// none. Called with st.mu held.
func (st *stream) deadlineDue() (time.Time, string, bool) {
	o := &st.s.opts
	switch {
	case st.state < stateForwarded && st.bodyStart.IsZero():
		return st.start.Add(o.RequestBodyStartTimeout), limitBodyStart, o.RequestBodyStartTimeout > 0
	case st.state < stateForwarded:
		return st.bodyStart.Add(o.RequestBodyTimeout), limitBody, o.RequestBodyTimeout > 0
	}
	return st.lastMsg.Add(o.ResponseIdleTimeout), limitResponseIdle, o.ResponseIdleTimeout > 0
}

// armDeadline sets the deadline timer for the current state. Called with
// st.mu held, at each transition that changes which deadline applies.
func (st *stream) armDeadline() {
	due, _, ok := st.deadlineDue()
	if !ok {
		if st.deadline != nil {
			st.deadline.Stop()
		}
		return
	}
	d := time.Until(due)
	if st.deadline == nil {
		st.deadline = time.AfterFunc(d, st.deadlineExpired)
		return
	}
	st.deadline.Reset(d)
}

// deadlineExpired runs on the timer's goroutine. If the state's deadline
// really passed (the state may have moved on, and the response deadline
// counts from the last message), the stream ends: a request still being
// received is answered 408; a forwarded one just ends, DEADLINE_EXCEEDED,
// since its client is talking to the model server already.
func (st *stream) deadlineExpired() {
	st.mu.Lock()
	defer st.mu.Unlock()
	defer st.guardTimer("deadline timer")
	if st.closed || st.over {
		return
	}
	due, limit, ok := st.deadlineDue()
	if !ok {
		return
	}
	if d := time.Until(due); d > 0 {
		st.deadline.Reset(d)
		return
	}
	st.s.limits.rejections.WithLabelValues(limit).Inc()
	var err error
	switch limit {
	case limitResponseIdle:
		st.s.log.V(2).Info("response phase idle too long; ending the stream", "pool", st.poolName, "request", st.requestID, "state", st.state.String(), "timeout", st.s.opts.ResponseIdleTimeout.String())
		err = status.Errorf(codes.DeadlineExceeded, "ext_proc: no message for %s in state %s, the limit set by --response-idle-timeout", st.s.opts.ResponseIdleTimeout, st.state)
	case limitBodyStart:
		err = st.fail(&httpError{code: http.StatusRequestTimeout, reason: "RequestTimeout",
			msg: "no request body within " + st.s.opts.RequestBodyStartTimeout.String() + " of the stream's start (state " + st.state.String() + "), the limit set by --request-body-start-timeout"})
	default:
		err = st.fail(&httpError{code: http.StatusRequestTimeout, reason: "RequestTimeout",
			msg: "request body not complete within " + st.s.opts.RequestBodyTimeout.String() + " of its first bytes (state " + st.state.String() + "), the limit set by --request-body-timeout"})
	}
	st.end(err)
}

// end ends the stream from a goroutine other than its loop: Process
// returns err and the loop's next Recv fails. Called with st.mu held.
func (st *stream) end(err error) {
	if st.over {
		return // already ending
	}
	st.over = true
	st.ended <- err // room: this is the one send besides the loop's
}

// guardTimer, deferred in a timer callback after its Unlock is deferred,
// turns a panic there into the stream's end with INTERNAL (a timer's
// goroutine has no caller to recover it).
func (st *stream) guardTimer(where string) {
	if r := recover(); r != nil {
		st.end(st.s.limits.recovered(st.s.log, r, where, "pool", st.poolName, "request", st.requestID))
	}
}
