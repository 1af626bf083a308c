// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/internal/labelvalue"
	"github.com/poolpicker/poolpicker/requestbody"
)

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
	party := poolAccount(st.s.limits.streams, pool)
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
			st.req.Objective = st.take(hv, name, 0)
		case hdrObjectiveDeprecated:
			if v := st.take(hv, name, 0); st.req.Objective == "" {
				st.req.Objective = v
			}
		case hdrModelRewrite:
			st.req.ModelRewrite = st.take(hv, name, 0)
		case hdrModelRewriteDeprecated:
			if v := st.take(hv, name, 0); st.req.ModelRewrite == "" {
				st.req.ModelRewrite = v
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
				st.req.CandidateIPs = splitList(st.take(hv, name, maxIPListBytes))
			}
		case st.s.flowHeader:
			st.req.Flow = st.take(hv, name, 0) // a flow-control queue key
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
