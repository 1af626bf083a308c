// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/poolpicker/poolpicker/requestbody"
)

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
		st.heldParty = poolAccount(st.s.limits.held, st.pool)
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
