// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
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
// and held request-body bytes, each a fairshare.Limit divided between
// namespaces and pools, and what was refused.
//
// A stream is counted from its start against MaxConcurrentStreams as a
// whole (its pool is not known before its request headers); once the
// headers name its pool the stream moves to the pool's share, and a pool
// past its share is answered 429 for that request alone. Only a gateway
// can open a stream that never sends headers (it opens the stream with
// them); such a stream holds the process-wide count until
// RequestBodyStartTimeout ends it.
type limits struct {
	streams *fairshare.Limit
	held    *fairshare.Limit
	// unresolved is the streams' account before their pool is known.
	unresolved *fairshare.Party
	rejections *prometheus.CounterVec
	panics     prometheus.Counter
}

// bodyMsgOverheadBytes is what a request-body message is charged beyond
// its bytes: its protobuf message and the stream's note of its size, so
// that empty chunks are not free to hold.
const bodyMsgOverheadBytes = 256

func newLimits(reg prometheus.Registerer, o *Options) (*limits, error) {
	l := &limits{
		streams: fairshare.New(fairshare.Options{Name: limitConcurrentStreams, Flag: "max-concurrent-streams", Unit: "streams",
			Capacity: int64(o.MaxConcurrentStreams), ReservePercent: o.FairShareReservePercent}),
		held: fairshare.New(fairshare.Options{Name: limitHeldBodyBytes, Flag: "max-held-request-body-bytes", Unit: "bytes",
			Capacity: o.MaxHeldRequestBodyBytes, ReservePercent: o.FairShareReservePercent}),
	}
	l.unresolved = l.streams.Unshared()
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
	}, func() float64 { return float64(l.streams.Total()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "poolpicker_extproc_held_request_body_bytes",
		Help: "Request-body bytes held by all streams now, as counted against --max-held-request-body-bytes.",
	}, func() float64 { return float64(l.held.Total()) })
	for _, c := range []prometheus.Collector{l.rejections, l.panics, streams, held, l.streams, l.held} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// EndpointsChanged and PoolRemoved make limits a datastore.Observer: a
// removed pool's accounts (and their series) go once they hold nothing.
func (l *limits) EndpointsChanged(*datastore.Pool, []*datastore.Endpoint, []*datastore.Endpoint) {}

func (l *limits) PoolRemoved(pool *datastore.Pool) {
	l.streams.Forget(pool.Key.Namespace, pool.Key.Name)
	l.held.Forget(pool.Key.Namespace, pool.Key.Name)
}

// poolAccount is pool's account of limit for a stream that resolved the
// pool and may outlive it: one the pool's PoolRemoved has forgotten is not
// revived, so a body sent after the pool went leaves no account behind.
func poolAccount(limit *fairshare.Limit, pool *datastore.Pool) *fairshare.Party {
	return limit.PartyWhile(pool.Key.Namespace, pool.Key.Name, func() bool { return !pool.Removed() })
}

// admit takes a stream slot of the process's limit, or says why not.
func (l *limits) admit() error {
	if !l.unresolved.AcquireUnshared(1) {
		l.rejections.WithLabelValues(limitConcurrentStreams).Inc()
		return status.Errorf(codes.ResourceExhausted, "ext_proc: %d streams are open, the limit set by --max-concurrent-streams; retry later or raise the limit", l.streams.Capacity())
	}
	return nil
}

// shareError is the answer for a pool past its share of a limit: 429 for
// streams (more requests than the pool's share), 503 for held bytes.
func (l *limits) shareError(err error, code int, reason, limit string) *httpError {
	l.rejections.WithLabelValues(limit).Inc()
	return &httpError{code: code, reason: reason, msg: "the endpoint picker's " + limit + " limit: " + err.Error()}
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
