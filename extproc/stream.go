// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/internal/labelvalue"
	"github.com/poolpicker/poolpicker/requestbody"
	"github.com/poolpicker/poolpicker/scheduling"
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
	start        time.Time
	requestID    string
	method       string
	path         requestbody.Kind
	pathWasSeen  bool
	hasCLength   bool
	objective    string
	flow         string // the flow-control flow header's value
	modelRewrite string
	candidateIPs []string
	resolveIn    resolveInput
	trace        traceState
	pool         *datastore.Pool
	poolName     string // pool.Key as text, made once
	poolSource   string
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
	dest     string
	counted  *datastore.Endpoint // endpoint holding this request's in-flight count
	ticket   *flowcontrol.Ticket // flow control's hold, told of the pick and the end
	picked   *scheduling.Result  // the decision, told the server's cached tokens at the end
	finished bool

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
		ended: make(chan error, 2), streamParty: s.limits.unresolved}
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

func (st *stream) applyProtocolConfig(pc *extprocv3.ProtocolConfiguration) {
	if pc == nil {
		return
	}
	st.configured = true
	wait := !pc.GetSendBodyWithoutWaitingForHeaderResponse()
	switch pc.GetRequestBodyMode() {
	case filterv3.ProcessingMode_NONE:
		st.noBody = true
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_STREAMED:
		st.reqReply, st.holdHeaders = replyCommon, !wait
	default: // FULL_DUPLEX_STREAMED, GRPC
		st.reqReply, st.holdHeaders = replyStreamed, true
	}
	if pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		st.respReply = replyStreamed
	} else {
		st.respReply = replyCommon
	}
}

func (st *stream) onRequestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.state != stateAwaitHeaders {
		return false, st.unexpected("request headers")
	}
	st.applyProtocolConfig(req.GetProtocolConfig())
	st.readHeaders(h.GetHeaders())
	st.readTags(req, h)
	if st.s.opts.Tracer != nil {
		st.trace.start(st.ctx, st.s.opts.Tracer, st.start, st.requestID)
	}
	if st.badInput != nil {
		return true, st.fail(st.badInput)
	}

	pool, source, herr := resolvePool(st.s.reg, &st.resolveIn)
	if herr != nil {
		if synced := st.s.opts.PoolsSynced; synced != nil && !synced() {
			// Before the pool controller's first sync (a replica just
			// started) an unknown pool says nothing about the request:
			// another replica may serve it. Unavailable is what gateways
			// retry elsewhere; a 503 would reach the client.
			return true, status.Errorf(codes.Unavailable, "endpoint picker not ready: its InferencePools are not synced yet (%s)", herr.msg)
		}
		return true, st.fail(herr)
	}
	st.pool, st.poolName, st.poolSource = pool, pool.Key.String(), source
	if st.trace.span != nil {
		st.trace.resolved(pool, source)
	}
	if !pool.Synced() {
		// This pool alone is unavailable: other pools keep serving.
		return true, st.fail(errNotSynced(pool))
	}
	// The stream moves to its pool's share of the stream limit.
	party := st.s.limits.streams.Party(pool.Key.Namespace, pool.Key.Name)
	if err := st.streamParty.MoveTo(party, 1); err != nil {
		return true, st.fail(st.s.limits.shareError(err, http.StatusTooManyRequests, "StreamShareExhausted", limitConcurrentStreams))
	}
	st.streamParty = party

	if h.GetEndOfStream() || st.noBody {
		return st.decide(nil, nil)
	}
	if st.holdHeaders {
		st.state = stateHoldBody
		if !st.configured && st.resolveIn.eppHost == "" {
			// Without protocol_config the mode is unknown: if no body comes
			// soon, the gateway is waiting for this answer (BUFFERED).
			st.timer = time.AfterFunc(st.s.opts.BodyWaitTimeout, st.bodyWaitExpired)
		}
		return false, nil
	}
	st.state = stateBodyAfterAnswer
	st.headersSent = true
	return false, st.send(headersResponse(&extprocv3.CommonResponse{}))
}

// bodyWaitExpired runs on the timer's goroutine: the gateway sent headers
// without end_of_stream and no body followed, so it waits for the header
// answer. Answer continue; the decision will ride on the body answer.
func (st *stream) bodyWaitExpired() {
	st.mu.Lock()
	defer st.mu.Unlock()
	defer st.guardTimer("body-wait timer")
	if st.closed || st.over || st.state != stateHoldBody || len(st.chunkSizes) > 0 || st.headersSent {
		return
	}
	st.s.log.V(4).Info("no body after headers; answering headers first", "pool", st.poolName, "request", st.requestID)
	st.state = stateBodyAfterAnswer
	st.headersSent = true
	st.reqReply, st.respReply = replyCommon, replyCommon
	if err := st.send(headersResponse(&extprocv3.CommonResponse{})); err != nil {
		st.s.log.V(2).Info("answering headers failed", "request", st.requestID, "err", err.Error())
	}
}

func (st *stream) readHeaders(hm *corev3.HeaderMap) {
	for _, hv := range hm.GetHeaders() {
		k := hv.GetKey()
		// Gateways send lower-case names (HTTP/2); NGF's shim does too, but
		// do not rely on it for the few we read. Every value read is
		// checked (take) before it can reach a label, log, span or header:
		// an invalid one is answered 400 naming the header.
		switch name := strings.ToLower(k); name {
		case ":path":
			st.path = requestbody.KindOf(st.take(hv, name, maxPathBytes))
			st.pathWasSeen = true
		case ":method":
			st.method = st.take(hv, name, 0)
		case "content-length":
			st.hasCLength = true
			st.cLength, _ = strconv.Atoi(st.take(hv, name, 0))
		case hdrRequestID:
			// Only recorded (logs, spans, the scheduler's logs): an invalid
			// ID is kept as a bounded placeholder, not refused.
			st.requestID = labelvalue.Placeholder(headerValue(hv), 0)
		case hdrObjective:
			st.objective = st.take(hv, name, 0)
		case hdrObjectiveDeprecated:
			if v := st.take(hv, name, 0); st.objective == "" {
				st.objective = v
			}
		case hdrModelRewrite:
			st.modelRewrite = st.take(hv, name, 0)
		case hdrModelRewriteDeprecated:
			if v := st.take(hv, name, 0); st.modelRewrite == "" {
				st.modelRewrite = v
			}
		case hdrEPPHost:
			st.resolveIn.eppHost = st.take(hv, name, maxAuthorityBytes)
		case hdrEPPPort:
			st.resolveIn.eppPort = st.take(hv, name, 0)
		case hdrTraceParent, hdrTraceState:
			// W3C trace context: a value that cannot be parsed starts a new
			// trace; it is not the client's error.
			v := headerValue(hv)
			if !labelvalue.Valid(v, maxTraceBytes) {
				v = ""
			}
			if name == hdrTraceParent {
				st.trace.parent = v
			} else {
				st.trace.state = v
			}
		case hdrPoolTag:
			if st.s.opts.TrustPoolHeader {
				st.resolveIn.header = st.take(hv, name, 0)
			}
		case HeaderConformanceSelection:
			if st.s.opts.EnableConformanceTestBehaviors {
				st.candidateIPs = splitList(st.take(hv, name, maxIPListBytes))
			}
		case st.s.flowHeader:
			st.flow = st.take(hv, name, 0) // a flow-control queue key
		}
	}
	if !st.pathWasSeen {
		st.path = requestbody.NoPath
	}
}

func splitList(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// readTags gathers every explicit pool tag and the subset hint, checking
// each value as readHeaders does.
func (st *stream) readTags(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	in := &st.resolveIn
	tag := func(source, v string) {
		if st.checkValue("pool tag "+hdrPoolTag+" from "+source, v, 0) {
			in.tags = append(in.tags, sourcedValue{source, v})
		}
	}
	// Two lookups, not FromIncomingContext, which copies all the metadata.
	for _, v := range metadata.ValueFromIncomingContext(st.ctx, hdrPoolTag) {
		tag("grpc metadata", v)
	}
	if a := metadata.ValueFromIncomingContext(st.ctx, ":authority"); len(a) > 0 && st.checkValue("stream :authority", a[0], maxAuthorityBytes) {
		in.authority = a[0]
	}
	if mc := req.GetMetadataContext(); mc != nil {
		for ns, s := range mc.GetFilterMetadata() {
			if v, ok := structString(s, hdrPoolTag); ok {
				tag("metadata_context "+labelvalue.Placeholder(ns, 0), v)
			}
		}
		if s, ok := mc.GetFilterMetadata()[MetadataNamespaceSubset]; ok {
			if l, ok := structList(s, MetadataKeySubset); ok {
				if max := st.s.opts.MaxSubsetHintEntries; len(l) > max && st.badInput == nil {
					// Each entry costs the pick a set insert; a pool's
					// endpoints are far fewer.
					st.badInput = &httpError{code: http.StatusBadRequest, reason: "InvalidSubsetHint",
						msg: "subset hint " + MetadataKeySubset + " lists " + strconv.Itoa(len(l)) + " endpoints, more than the " + strconv.Itoa(max) + " allowed (--max-subset-hint-entries)"}
					l = nil
				}
				for _, a := range l {
					if !st.checkValue("subset hint entry of "+MetadataKeySubset, a, maxAddressBytes) {
						l = nil
						break
					}
				}
				in.subset = l
			}
		}
	}
	// HttpHeaders' attributes are deprecated for ProcessingRequest's, which
	// older Envoys do not send: both are read.
	for _, attrs := range []map[string]*structpb.Struct{req.GetAttributes(), h.GetAttributes()} { //nolint:staticcheck // SA1019: see above
		for ns, s := range attrs {
			if v, ok := structString(s, hdrPoolTag); ok {
				tag("attributes "+labelvalue.Placeholder(ns, 0), v)
			}
		}
	}
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.state != stateHoldBody && st.state != stateBodyAfterAnswer {
		return false, st.unexpected("request body")
	}
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.bodyStart.IsZero() {
		st.bodyStart = time.Now()
		st.armDeadline()
	}
	st.bodyBytes += len(b.GetBody())
	if st.bodyBytes > st.s.opts.MaxRequestBodyBytes {
		return true, st.fail(&httpError{code: http.StatusRequestEntityTooLarge, reason: "RequestTooLarge",
			msg: "request body exceeds " + strconv.Itoa(st.s.opts.MaxRequestBodyBytes) + " bytes"})
	}
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	// The body is held once (in place, or joined with the messages let
	// go), and each message costs its overhead, empty ones too.
	charge := int64(len(b.GetBody())) + bodyMsgOverheadBytes
	if st.heldParty == nil {
		st.heldParty = st.s.limits.held.Party(st.pool.Key.Namespace, st.pool.Key.Name)
	}
	if err := st.heldParty.Acquire(charge); err != nil {
		st.releaseBody()
		return true, st.fail(st.s.limits.shareError(err, http.StatusServiceUnavailable, "BodyBudgetExhausted", limitHeldBodyBytes))
	}
	st.held += charge
	st.chunkSizes = append(st.chunkSizes, len(b.GetBody()))
	if eos && len(st.chunkSizes) == 1 {
		st.oneChunk = b.GetBody()
		return st.bodyComplete() // the whole body in one message: read in place
	}
	// Read the body as it arrives, so that at its end only the last chunk
	// is left to read: the decision waits for the body, not for its parse.
	if st.scan == nil {
		st.scan = requestbody.NewScanner(st.path, st.s.promptLimit)
		st.joined = joinBuffer(st.cLength)
	}
	if need := len(*st.joined) + len(b.GetBody()); need > cap(*st.joined) {
		// Double, where append grows a large slice by a quarter: a large
		// body in small pieces would be copied many more times on its way
		// up.
		grown := make([]byte, len(*st.joined), min(max(need, 2*cap(*st.joined)), st.s.opts.MaxRequestBodyBytes))
		copy(grown, *st.joined)
		*st.joined = grown
	}
	*st.joined = append(*st.joined, b.GetBody()...)
	if err := st.scan.Feed(*st.joined, false); err != nil && st.path.Strict() {
		// The defect is in: the rest of the body cannot mend it.
		return true, st.fail(&httpError{code: http.StatusBadRequest, reason: "BadRequest", msg: err.Error()})
	}
	if eos {
		return st.bodyComplete()
	}
	return false, nil
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

// joinBuffers recycles the buffers a body of several chunks is joined
// into (*[]byte): a fresh zeroed buffer per request, and the garbage
// collections it brings, cost a large share of the round trip (the
// performance page has the figure). The joined body is dead once the
// decision is sent: the prompt is hashed before (Result.Commit included),
// a rewrite copies, and the chunks, not the joined body, are what is
// forwarded.
var joinBuffers sync.Pool

// maxPooledJoinBytes bounds the buffers kept for reuse, so one huge body
// does not pin its memory for the life of the process.
const maxPooledJoinBytes = 1 << 20

// joinBuffer returns an empty buffer for a body of about size bytes (0:
// unknown).
func joinBuffer(size int) *[]byte {
	if size <= maxPooledJoinBytes {
		if p, ok := joinBuffers.Get().(*[]byte); ok {
			if cap(*p) >= size {
				*p = (*p)[:0]
				return p
			}
			joinBuffers.Put(p)
		}
	}
	b := make([]byte, 0, min(max(size, 64<<10), maxPooledJoinBytes))
	return &b
}

// releaseJoined gives the joined body's buffer back for reuse.
func (st *stream) releaseJoined() {
	if st.joined == nil {
		return
	}
	if cap(*st.joined) <= maxPooledJoinBytes {
		joinBuffers.Put(st.joined)
	}
	st.joined = nil
}

// releaseBody lets go of the held body and its charge to the budget.
// Called with st.mu held, once the decision is sent (the body is
// forwarded by then) or the stream ends.
func (st *stream) releaseBody() {
	st.releaseHeld()
	st.oneChunk = nil
	st.chunkSizes = nil
}

// releaseHeld gives back the body's charge to the held-body budget: when
// the body goes, or when the request waits in flow control's queue, whose
// own limit (--flow-control-max-queued-bytes) counts it there.
func (st *stream) releaseHeld() {
	if st.held != 0 {
		st.heldParty.Release(st.held)
		st.held = 0
	}
}

// bodyComplete reads what is left of the ended body and decides on it.
func (st *stream) bodyComplete() (bool, error) {
	defer st.releaseBody()
	if st.scan == nil {
		// Zero or one chunk: read in place.
		body := []byte{}
		if len(st.chunkSizes) == 1 {
			body = st.oneChunk
		}
		r := requestbody.NewScanner(st.path, st.s.promptLimit)
		_ = r.Feed(body, true) // the defect, if any, is Result's error
		return st.decide(body, r)
	}
	defer st.releaseJoined()
	body := *st.joined
	_ = st.scan.Feed(body, true)
	return st.decide(body, st.scan)
}

// decide takes what r read of the whole body (nil: no body), schedules,
// and sends the answers the gateway is waiting for, then moves to
// stateForwarded.
func (st *stream) decide(body []byte, r requestbody.Reader) (bool, error) {
	// Scores go to the gateway (--emit-endpoint-scores) and to the picked
	// log line at V(5).
	sreq := &scheduling.Request{ID: st.requestID, Objective: st.objective, Subset: st.resolveIn.subset, CandidateIPs: st.candidateIPs,
		Scores: st.s.opts.EmitEndpointScores || st.s.log.V(5).Enabled()}
	if st.candidateIPs == nil {
		sreq.CandidateIPs = nil
	}
	var rb *requestbody.Request
	if body != nil {
		var err error
		rb, err = r.Result(body)
		if err != nil {
			return true, st.fail(&httpError{code: http.StatusBadRequest, reason: "BadRequest", msg: err.Error()})
		}
		// The reader has refused invalid UTF-8; the model also becomes a
		// label, a log field and a span attribute, so it is bounded too.
		if err := labelvalue.Check(rb.Model, 0); err != nil {
			return true, st.fail(&httpError{code: http.StatusBadRequest, reason: "BadRequest", msg: `"model" ` + err.Error()})
		}
		// rb.Prompt is a slice of body: the gRPC message's bytes for a
		// one-chunk body, else the joined chunks, whose buffer is reused
		// only after decide returns, after Result.Commit. The scheduler
		// hashes the prompt and keeps nothing.
		sreq.Model, sreq.Prompt = rb.Model, rb.Prompt
		st.usage.sse = rb.Stream
	}
	requested := sreq.Model
	if st.modelRewrite != "" {
		sreq.Model = st.modelRewrite
	}
	st.setLabels(requested, sreq.Model)
	perEndpoint := false
	if fc := st.s.opts.FlowControl; fc != nil {
		if done, err := st.awaitEndpoints(); done {
			return true, err
		}
		perEndpoint = fc.PerEndpoint()
		if !perEndpoint {
			// Released when the pool has a free slot, then scheduled.
			if done, err := st.admit(nil, 0); done {
				return true, err
			}
			defer st.ticket.Picked() // a failed pick frees the queue too
		}
		sreq.Admitted = true
	}
	scheduleStart := time.Now()
	res, err := st.s.sched.ScheduleDeferred(st.ctx, st.pool, sreq)
	scheduleTime := time.Since(scheduleStart)
	st.s.metrics.scheduled(st.pool, scheduleTime)
	if st.trace.span != nil {
		st.trace.scheduled(sreq.Model, scheduleTime)
	}
	// Learning from the pick waits until the answer is sent (and before a
	// pooled body that sreq.Prompt may alias is reused); a request flow
	// control refused went nowhere and teaches nothing.
	refused := false
	defer func() {
		if !refused {
			res.Commit()
		}
	}()
	if err != nil || res == nil || len(res.Endpoints) == 0 {
		st.s.metrics.attempted(st.labels, nil)
	}
	if err != nil {
		var se *scheduling.Error
		if errors.As(err, &se) {
			return true, st.fail(&httpError{code: se.Code, reason: se.Reason, msg: se.Message})
		}
		if st.ctx.Err() != nil {
			return true, status.FromContextError(st.ctx.Err()).Err()
		}
		return true, st.fail(&httpError{code: http.StatusServiceUnavailable, reason: "SchedulingFailed", msg: err.Error()})
	}
	if res == nil || len(res.Endpoints) == 0 {
		return true, st.fail(&httpError{code: http.StatusServiceUnavailable, reason: "NoEligibleEndpoints", msg: "the scheduler returned no endpoint for pool " + st.poolName})
	}
	if perEndpoint {
		if refused, err = st.admit(res, affinity(res.TargetModel, sreq.Prompt)); refused {
			return true, err
		}
		defer st.ticket.Picked() // a failed pick frees the queue too
	}
	target := res.TargetModel
	if target == "" {
		target = sreq.Model
	}
	st.setLabels(requested, target)
	st.s.metrics.attempted(st.labels, res.Endpoints[0])
	if res.ModelRewrite != "" {
		st.s.metrics.rewritten(res.ModelRewrite, st.labels)
	}

	var sb strings.Builder
	n := len(res.Endpoints) - 1
	for _, e := range res.Endpoints {
		n += len(e.Address)
	}
	sb.Grow(n)
	for i, e := range res.Endpoints {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(e.Address)
	}
	st.dest = sb.String()

	newBody := body
	if rb != nil && rb.HasModel() && target != rb.Model {
		newBody = rb.RewriteModel(body, target)
	}
	set := []*corev3.HeaderValueOption{setHeader(HeaderDestination, st.dest), setHeader(HeaderPool, st.poolName)}
	if body != nil && len(newBody) != len(body) && st.hasCLength {
		set = append(set, contentLength(len(newBody)))
	}
	if st.trace.span != nil {
		set = st.trace.picked(set, st.dest, target)
	}
	mutation := &extprocv3.HeaderMutation{SetHeaders: set}

	// The count goes up as the decision leaves; close takes it down once.
	st.counted, st.picked = res.Endpoints[0], res
	st.addInFlight(st.counted, 1)
	st.ticket.Picked()
	st.s.metrics.routed(st.labels, res.Priority, st.bodyBytes)
	if log := st.s.log.V(4); log.Enabled() { // the arguments cost allocations
		kv := []any{"pool", st.poolName, "request", st.requestID, "source", st.poolSource, "endpoint", st.dest, "model", sreq.Model, "targetModel", target}
		if st.s.log.V(5).Enabled() {
			// Each candidate's weighted total, by ip:port.
			kv = append(kv, "scores", res.Scores)
		}
		log.Info("picked", kv...)
	}
	st.state = stateForwarded
	st.lastMsg = time.Now()
	st.armDeadline()

	if err := st.sendDecision(body, newBody, mutation); err != nil {
		return true, err
	}
	if st.trailersSeen {
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

func (st *stream) sendDecision(body, newBody []byte, mutation *extprocv3.HeaderMutation) error {
	md := destinationMetadata(st.dest, st.picked.Scores)
	if !st.headersSent {
		st.headersSent = true
		resp := headersResponse(&extprocv3.CommonResponse{HeaderMutation: mutation})
		resp.DynamicMetadata = md
		if err := st.send(resp); err != nil {
			return err
		}
		mutation, md = nil, nil
	}
	if body == nil {
		return nil
	}
	n := len(st.chunkSizes)
	if n == 0 {
		n = 1 // an end-of-stream without any body message still gets one answer
		if st.trailersSeen {
			n = 0
		}
	}
	if n == 0 && mutation != nil {
		// Headers were answered and the body ended in trailers with no
		// chunk: the decision rides on the trailers answer.
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: mutation}}, DynamicMetadata: md}
		st.trailersSeen = false
		return st.send(resp)
	}
	rewritten := len(newBody) != len(body) || (len(body) > 0 && &newBody[0] != &body[0])
	// The body (or the rewritten one) is cut at the sizes its messages
	// came in; a rewrite's remainder goes to the last answer.
	src := body
	if rewritten {
		src = newBody
	}
	off := 0
	for i := 0; i < n; i++ {
		last := i == n-1
		size := 0
		if i < len(st.chunkSizes) {
			size = st.chunkSizes[i]
		}
		end := min(off+size, len(src))
		if last {
			end = len(src)
		}
		piece := src[off:end]
		off = end
		resp, common := bodyAnswer(false, st.reqReply == replyStreamed, piece, last && !st.trailersSeen)
		if st.reqReply != replyStreamed && rewritten {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: piece}}
		}
		if i == 0 && mutation != nil {
			common.HeaderMutation = mutation
			resp.DynamicMetadata = md
		}
		if err := st.send(resp); err != nil {
			return err
		}
	}
	return nil
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

// readServed moves the in-flight count to the endpoint that actually served
// the request, when the gateway reports a fallback.
func (st *stream) readServed(mc *corev3.Metadata) {
	s, ok := mc.GetFilterMetadata()[MetadataNamespaceLB]
	if !ok {
		return
	}
	served, ok := structString(s, HeaderDestinationServed)
	if !ok || served == "" || st.servedSeen {
		return
	}
	if err := labelvalue.Check(served, maxAddressBytes); err != nil {
		// It is echoed in a header (conformance) and compared, never
		// trusted: a report that is no address is no report.
		st.s.log.V(2).Info("ignoring an invalid served endpoint", "pool", st.poolName, "request", st.requestID, "err", err.Error())
		return
	}
	st.servedSeen, st.served = true, served
	if st.finished || st.counted == nil || served == st.counted.Address {
		return
	}
	if e, ok := st.pool.Endpoints().Get(served); ok {
		st.addInFlight(e, 1)
		st.addInFlight(st.counted, -1)
		st.counted = e
	}
}

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders) error {
	if st.state != stateForwarded {
		return st.unexpected("response headers")
	}
	st.state = stateResponse
	for _, hv := range h.GetHeaders().GetHeaders() {
		// The response's content type decides; the request's stream flag
		// is only a guess for responses that carry none.
		if strings.EqualFold(hv.GetKey(), "content-type") {
			st.usage.sse = strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream")
		}
	}
	common := &extprocv3.CommonResponse{}
	if st.s.opts.EnableConformanceTestBehaviors {
		// A gateway that does not report the endpoint that served must be
		// visible to the suite, so its absence is echoed, not the pick.
		served := st.served
		if served == "" {
			served = conformanceServedMissing
		}
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderConformanceServed, served)}}
	}
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	if h.GetEndOfStream() {
		st.state = stateDone
		st.finish("completed", true)
	}
	return nil
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if st.state != stateResponse {
		return st.unexpected("response body")
	}
	st.usage.write(b.GetBody())
	if st.usage.sse && st.respBytes == 0 && len(b.GetBody()) > 0 {
		st.firstByte = time.Now()
	}
	st.respBytes += len(b.GetBody())
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	resp, _ := bodyAnswer(true, st.respReply == replyStreamed, b.GetBody(), eos)
	if err := st.send(resp); err != nil {
		return err
	}
	if eos {
		st.state = stateDone
		st.finish("completed", true)
	}
	return nil
}

func (st *stream) onResponseTrailers() error {
	if st.state != stateResponse && st.state != stateDone {
		return st.unexpected("response trailers")
	}
	st.state = stateDone
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}); err != nil {
		return err
	}
	st.finish("completed", true)
	return nil
}

// addInFlight counts the request on e (delta +1) or no longer (-1), and
// tells Options.InFlight.
func (st *stream) addInFlight(e *datastore.Endpoint, delta int64) {
	e.AddInFlight(delta)
	if o := st.s.opts.InFlight; o != nil {
		o.InFlightChanged(st.pool, e)
	}
}

// finish ends the request's accounting exactly once.
func (st *stream) finish(outcome string, completed bool) {
	if st.finished {
		return
	}
	st.finished = true
	if st.trace.span != nil {
		st.trace.end(outcome)
	}
	if st.counted != nil {
		st.addInFlight(st.counted, -1)
		st.s.metrics.ended(st.labels)
	}
	st.ticket.Done()
	if completed {
		u, ok := st.usage.finish()
		var ttft time.Duration
		if !st.firstByte.IsZero() {
			ttft = st.firstByte.Sub(st.start)
		}
		st.s.metrics.completed(st.labels, time.Since(st.start), ttft, st.respBytes, u, ok)
		if ok && u.HasCachedTokens {
			// The prefix index checks its prediction against the server.
			st.picked.ObserveCachedTokens(u.CachedTokens, u.PromptTokens)
		}
	}
	if log := st.s.log.V(5); st.counted != nil && log.Enabled() {
		log.Info("request finished", "pool", st.poolName, "request", st.requestID, "outcome", outcome, "endpoint", st.counted.Address)
	}
}
