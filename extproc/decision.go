// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"errors"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/internal/labelvalue"
	"github.com/poolpicker/poolpicker/requestbody"
	"github.com/poolpicker/poolpicker/requestcontrol"
)

// decide takes what r read of the whole body (nil: no body), schedules,
// and sends the answers the gateway is waiting for, then moves to
// stateForwarded.
func (st *stream) decide(body []byte, r requestbody.Reader) (bool, error) {
	var rb *requestbody.Request
	requested := ""
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
		// only after decide returns, after Request.Sent. The scheduler
		// hashes the prompt and keeps nothing.
		st.req.SetBody(rb.Model, rb.Prompt)
		requested = rb.Model
		st.usage.sse = rb.Stream
	}
	st.setLabels(requested, st.req.Model())
	st.req.Pool, st.req.ID, st.req.Subset, st.req.Bytes = st.pool, st.requestID, st.resolveIn.subset, st.bodyBytes
	// Scores go to the gateway (--emit-endpoint-scores) and to the picked
	// log line at V(5).
	st.req.Scores = st.s.opts.EmitEndpointScores || st.s.log.V(5).Enabled()
	d, err := st.req.Pick(st.ctx, st)
	// Learning from the pick, and letting flow control's queue go on, wait
	// until the answer is sent, a refusal's too.
	defer st.req.Sent()
	if d.Scheduled {
		st.s.metrics.scheduled(st.pool, d.ScheduleTime)
		if st.trace.span != nil {
			st.trace.scheduled(st.req.Model(), d.ScheduleTime)
		}
		if d.Result == nil {
			st.s.metrics.attempted(st.labels, nil)
		}
	}
	if err != nil {
		return true, st.refuse(err)
	}
	res, target := d.Result, d.Target
	st.setLabels(requested, target)
	st.s.metrics.attempted(st.labels, res.Endpoints[0])
	if d.ModelRewrite != "" {
		st.s.metrics.rewritten(d.ModelRewrite, st.labels)
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
	st.req.Commit()
	st.s.metrics.routed(st.labels, res.Priority, st.bodyBytes)
	if log := st.s.log.V(4); log.Enabled() { // the arguments cost allocations
		kv := []any{"pool", st.poolName, "request", st.requestID, "source", st.poolSource, "endpoint", st.dest, "model", st.req.Model(), "targetModel", target}
		if st.s.log.V(5).Enabled() {
			// Each candidate's weighted total, by ip:port.
			kv = append(kv, "scores", res.Scores)
		}
		if len(res.Statuses) > 0 {
			// Why filters dropped candidates, why a scorer could not score.
			kv = append(kv, "statuses", res.Statuses)
		}
		log.Info("picked", kv...)
	}
	st.state = stateForwarded
	st.lastMsg = time.Now()
	st.armDeadline()

	if err := st.sendDecision(body, newBody, mutation, res.Scores); err != nil {
		return true, err
	}
	if st.trailersSeen {
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

func (st *stream) sendDecision(body, newBody []byte, mutation *extprocv3.HeaderMutation, scores map[string]float64) error {
	md := destinationMetadata(st.dest, scores)
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

// Waiting and Resumed make the stream the requestcontrol.Waiter of its
// request: while it waits in flow control's queue (or waiting room) the
// stream is stateQueued, and the queue, not the held-body budget, counts
// its body (--flow-control-max-queued-bytes).
func (st *stream) Waiting() {
	st.queuedFrom = st.state
	st.state = stateQueued
	st.releaseHeld()
}

func (st *stream) Resumed() { st.state = st.queuedFrom }

// refuse answers a request flow control or the scheduler refused, or ends
// the stream of one whose client went away.
func (st *stream) refuse(err error) error {
	var rf *requestcontrol.Refusal
	if errors.As(err, &rf) {
		return st.fail(&httpError{code: rf.Code, reason: rf.Reason, msg: rf.Message})
	}
	return status.FromContextError(err).Err()
}
