// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/requestbody"
	"github.com/poolpicker/poolpicker/requestcontrol"
)

// streamState is where a stream is in its life; each transition is named
// in the handler that makes it.
type streamState int

const (
	// stateAwaitHeaders: nothing received yet.
	stateAwaitHeaders streamState = iota
	// stateHoldBody: request headers seen and not answered; body chunks are
	// held until the body is complete (FULL_DUPLEX_STREAMED, NGF's shim).
	stateHoldBody
	// stateBodyAfterAnswer: request headers answered with continue because
	// the gateway waits for that answer before sending the body (BUFFERED,
	// STREAMED); body chunks are held and the decision rides on the body answer.
	stateBodyAfterAnswer
	// stateQueued: the body is complete and the request waits in its
	// pool's flow-control queue (or waiting room) until it may be
	// scheduled; its deadline is the queue's TTL.
	stateQueued
	// stateForwarded: decision sent; the request may still send trailers,
	// then the response phase may begin.
	stateForwarded
	// stateResponse: response headers seen; following the response body.
	stateResponse
	// stateDone: response complete; only trailers or the close remain.
	stateDone
)

var stateNames = [...]string{"await-headers", "hold-body", "body-after-answer", "queued", "forwarded", "response", "done"}

func (s streamState) String() string { return stateNames[s] }

// bodyReply is how body chunks are answered.
type bodyReply int

const (
	// replyStreamed: FULL_DUPLEX_STREAMED — every chunk answered with a
	// streamed body mutation carrying the bytes, since the EPP owns them.
	replyStreamed bodyReply = iota
	// replyCommon: BUFFERED / STREAMED — a BodyResponse per body message.
	replyCommon
)

// stream is the state of one ext_proc stream, owned by its goroutine. mu
// is held while a message is handled; it exists only for the body-wait
// timer, the one other party that may answer the headers.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	mu     sync.Mutex
	state  streamState
	closed bool
	timer  *time.Timer // the body wait (BodyWaitTimeout)
	// deadline is the current state's deadline (limits.go); over is set
	// when it, or a panic on a timer, ended the stream from outside the
	// loop. ended carries how the stream ended to Process: from the loop,
	// a deadline or a timer (room for the loop's word and one other).
	deadline *time.Timer
	over     bool
	ended    chan error
	// bodyStart is when the first body message came; lastMsg when the last
	// message came once the decision was sent (the response deadline
	// counts from it).
	bodyStart time.Time
	lastMsg   time.Time
	// held is what this stream charged to its pool's share of the
	// held-body budget (heldParty); streamParty is the account its stream
	// slot is charged to, its pool's once the headers named it.
	held        int64
	heldParty   *fairshare.Party
	streamParty *fairshare.Party

	// Mode, from protocol_config when sent.
	configured   bool
	reqReply     bodyReply
	respReply    bodyReply
	holdHeaders  bool
	noBody       bool
	observe      bool
	headersSent  bool // request headers answered
	trailersSeen bool

	// From request headers.
	start       time.Time
	requestID   string
	method      string
	path        requestbody.Kind
	pathWasSeen bool
	hasCLength  bool
	resolveIn   resolveInput
	trace       traceState
	pool        *datastore.Pool
	poolName    string // pool.Key as text, made once
	poolSource  string
	// req is the request's life past its headers and body: admission,
	// scheduling, in-flight accounting (package requestcontrol). The
	// headers fill its objective, flow, model rewrite and candidates.
	req requestcontrol.Request
	// chunkSizes are the sizes of the body's messages, in order: a body
	// of one message is read in place (oneChunk); one of several is copied
	// into joined as it arrives and its messages are let go, so that the
	// body is held once. The decision forwards the body cut at these sizes.
	chunkSizes []int
	firstSizes [4]int // chunkSizes' backing array for bodies of up to four
	oneChunk   []byte
	bodyBytes  int
	respBytes  int
	// firstByte is when a streamed (text/event-stream) response's first
	// body byte came, its TTFT; zero until then, and for other responses.
	firstByte time.Time
	// A body of several chunks is read as it arrives: scan reads joined,
	// the chunks so far copied into a reused buffer (joinBuffers).
	scan      requestbody.Reader
	joined    *[]byte
	cLength   int
	labels    requestLabels
	labelsSet bool
	// badInput is the first value read that failed its check (input.go).
	badInput *httpError

	// Decision.
	dest string
	// queuedFrom is the state to go back to when a wait in flow control
	// ends (Resumed).
	queuedFrom streamState

	// Response.
	usage      usageReader
	servedSeen bool
	served     string
}

// Process serves one ext_proc stream: one HTTP request and its response.
//
// The stream's loop (Recv, then handle) runs on a goroutine of its own so
// that a deadline or a timer's panic can end the stream while the loop
// waits in Recv: Process returns, gRPC cancels the stream, and the loop's
// Recv fails. A panic in the loop ends this stream alone, with INTERNAL.
// Either way close releases what the stream held, once.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if err := s.limits.admit(); err != nil {
		return err
	}
	s.streams.Add(2) // this handler and its loop
	defer s.streams.Done()
	st := &stream{s: s, srv: srv, ctx: srv.Context(), start: time.Now(), reqReply: replyStreamed, respReply: replyStreamed, holdHeaders: true,
		ended: make(chan error, 2), streamParty: s.limits.unresolved, req: s.requests.Request()}
	st.chunkSizes = st.firstSizes[:0]
	st.mu.Lock()
	st.armDeadline()
	st.mu.Unlock()
	go st.loop()
	err := <-st.ended
	st.close(err)
	return err
}

// loop runs the stream until it is over, and says how on st.ended.
func (st *stream) loop() {
	defer st.s.streams.Done()
	defer func() {
		if r := recover(); r != nil {
			st.ended <- st.s.limits.recovered(st.s.log, r, "stream", "pool", st.poolName, "request", st.requestID)
		}
	}()
	growStack()
	st.ended <- st.run()
}

// growStack grows the stream goroutine's stack, new for every stream, to
// what the decision needs, while it is one frame deep. The decision path
// (scanner, scheduler, protobuf marshalling of the answer) is deep enough
// to outgrow a new goroutine's stack; growing there copies the stack by
// doubling, frames and all, several times per stream (its cost is on the
// performance page).
//
//go:noinline
func growStack() {
	var frame [stackBytes]byte
	keep(frame[:])
}

// stackBytes is what the decision path was seen to need, rounded up.
const stackBytes = 16 << 10

//go:noinline
func keep([]byte) {}

func (st *stream) run() error {
	for {
		req, err := st.srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the gateway closed its side: nothing more to answer
			}
			if st.ctx.Err() != nil {
				return status.FromContextError(st.ctx.Err()).Err()
			}
			return err
		}
		done, err := st.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// close ends the stream: stops the timer and finishes accounting if the
// response never completed (stream closed early, error, cancel).
func (st *stream) close(err error) {
	st.mu.Lock()
	st.closed = true
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.deadline != nil {
		st.deadline.Stop()
	}
	st.releaseJoined()
	st.releaseBody()
	st.streamParty.Release(1)
	st.mu.Unlock()
	outcome := "closed"
	if err != nil {
		outcome = "error"
		if st.ctx.Err() != nil {
			outcome = "canceled"
		}
		st.s.log.V(2).Info("ext_proc stream failed", "pool", st.poolName, "request", st.requestID, "state", st.state.String(), "err", err.Error())
	}
	st.finish(outcome, false)
}

// handle processes one message; done means the stream is over (an
// immediate response was sent).
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.over {
		return true, nil // a deadline ended the stream while this message came
	}
	if st.state >= stateForwarded {
		st.lastMsg = time.Now()
	}
	if req.GetObservabilityMode() {
		st.observe = true
	}
	if req.GetMetadataContext() != nil && st.state >= stateForwarded {
		st.readServed(req.GetMetadataContext())
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.onResponseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return false, st.onResponseTrailers()
	case nil:
		// Flow-control-only messages carry nothing to answer.
		return false, nil
	default:
		return false, status.Errorf(codes.Unimplemented, "unsupported ext_proc message %T", r)
	}
}

func (st *stream) unexpected(what string) error {
	return status.Errorf(codes.FailedPrecondition, "ext_proc: unexpected %s in state %s", what, st.state)
}

func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if st.observe {
		return nil
	}
	return st.srv.Send(resp)
}

func (st *stream) onRequestTrailers() (bool, error) {
	switch st.state {
	case stateHoldBody, stateBodyAfterAnswer:
		// Trailers end the body.
		st.trailersSeen = true
		return st.bodyComplete()
	case stateForwarded:
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, st.unexpected("request trailers")
}

func (st *stream) setLabels(model, target string) {
	st.labels = st.s.metrics.labels(model, target, st.pool)
	st.labelsSet = true
}

// fail answers the client with an error and ends the stream.
func (st *stream) fail(e *httpError) error {
	if !st.labelsSet {
		st.setLabels("", "")
	}
	st.s.metrics.failed(st.labels, e.code)
	if st.trace.span != nil {
		st.trace.failed(e)
	}
	st.s.log.V(2).Info("request refused", "pool", st.poolName, "request", st.requestID, "code", e.code, "reason", e.reason, "message", e.msg)
	st.state = stateDone
	return st.send(immediateResponse(e))
}
