// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Header and metadata names on the wire.
const (
	// HeaderDestination carries "ip:port[,ip:port...]": primary, then fallbacks.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderDestinationServed is the metadata key naming the endpoint that
	// actually served the request, after the gateway's retries.
	HeaderDestinationServed = "x-gateway-destination-endpoint-served"
	// HeaderPool names the picked pool ("namespace/name") on the request sent
	// upstream, for access logs and debugging.
	HeaderPool = "x-poolpicker-pool"
	// HeaderConformanceSelection restricts candidates to IPs (conformance only).
	HeaderConformanceSelection = "test-epp-endpoint-selection"
	// HeaderConformanceServed echoes the served endpoint (conformance only).
	HeaderConformanceServed = "x-conformance-test-served-endpoint"
	// conformanceServedMissing is HeaderConformanceServed's value when the
	// gateway reported no served endpoint, worded as upstream's verifier.
	conformanceServedMissing = "fail: missing destination endpoint served metadata"
	// MetadataNamespaceLB is the dynamic-metadata namespace gateways read.
	MetadataNamespaceLB = "envoy.lb"
	// MetadataNamespaceSubset holds the gateway's subset hint.
	MetadataNamespaceSubset = "envoy.lb.subset_hint"
	// MetadataKeySubset is the subset hint's key: a list of "ip:port".
	MetadataKeySubset = "x-gateway-destination-endpoint-subset"
	// MetadataKeyScores is the envoy.lb key of the scheduler's score of
	// each endpoint it scored, a struct "ip:port" → number, beside the
	// destination (Options.EmitEndpointScores, as the llm-d router's
	// --emit-endpoint-scores).
	MetadataKeyScores = "x-gateway-destination-endpoint-scores"

	hdrPoolTag   = "x-gateway-inference-pool"
	hdrRequestID = "x-request-id"
	hdrEPPHost   = "x-epp-host"
	hdrEPPPort   = "x-epp-port"

	// hdrObjective names the request's InferenceObjective; the older
	// x-gateway- name is honoured too, the current one winning when both
	// are sent.
	hdrObjective           = "x-llm-d-inference-objective"
	hdrObjectiveDeprecated = "x-gateway-inference-objective"
	// hdrModelRewrite names the model the request is forwarded with, in
	// place of the body's (and before the pool's rewrite rules); the older
	// name is honoured too, the current one winning.
	hdrModelRewrite           = "x-llm-d-model-name-rewrite"
	hdrModelRewriteDeprecated = "x-gateway-model-name-rewrite"
)

// httpError is a failure answered to the client as an ImmediateResponse.
type httpError struct {
	code   int
	reason string
	msg    string
}

func (e *httpError) Error() string { return e.reason + ": " + e.msg }

// errorBody is the OpenAI-style error envelope clients already parse.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
		Reason  string `json:"reason,omitempty"`
	} `json:"error"`
}

func openAIErrorType(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	return "service_unavailable"
}

func immediateResponse(e *httpError) *extprocv3.ProcessingResponse {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code, b.Error.Reason = e.msg, openAIErrorType(e.code), e.code, e.reason
	body, _ := json.Marshal(&b)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}},
			Body:    body,
			Details: e.reason,
		},
	}}
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// headerValue reads a header's value from RawValue or Value: gateways use either.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// destinationMetadata is the envoy.lb dynamic metadata naming the endpoints,
// with the endpoints' scores when there are any.
func destinationMetadata(dest string, scores map[string]float64) *structpb.Struct {
	// Every message in one allocation (one per request, on the hot path).
	m := &struct {
		outer, inner structpb.Struct
		lb, dest     structpb.Value
		lbKind       structpb.Value_StructValue
		destKind     structpb.Value_StringValue
	}{}
	m.destKind.StringValue = dest
	m.dest.Kind = &m.destKind
	m.inner.Fields = map[string]*structpb.Value{HeaderDestination: &m.dest}
	if len(scores) > 0 {
		fields := make(map[string]*structpb.Value, len(scores))
		for addr, v := range scores {
			fields[addr] = structpb.NewNumberValue(v)
		}
		m.inner.Fields[MetadataKeyScores] = structpb.NewStructValue(&structpb.Struct{Fields: fields})
	}
	m.lbKind.StructValue = &m.inner
	m.lb.Kind = &m.lbKind
	m.outer.Fields = map[string]*structpb.Value{MetadataNamespaceLB: &m.lb}
	return &m.outer
}

func headersResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}
}

// bodyAnswer answers a request body chunk (a response body chunk with
// response set). With streamed (FULL_DUPLEX_STREAMED) the answer carries
// piece on, and ends the body with eos. The caller may add to the returned
// CommonResponse before sending.
func bodyAnswer(response, streamed bool, piece []byte, eos bool) (*extprocv3.ProcessingResponse, *extprocv3.CommonResponse) {
	// Every message in one allocation: each chunk of a body is answered, a
	// 64 KiB request in four, a streamed response in hundreds.
	m := &struct {
		resp     extprocv3.ProcessingResponse
		req      extprocv3.ProcessingResponse_RequestBody
		res      extprocv3.ProcessingResponse_ResponseBody
		body     extprocv3.BodyResponse
		common   extprocv3.CommonResponse
		mutation extprocv3.BodyMutation
		streamed extprocv3.BodyMutation_StreamedResponse
		piece    extprocv3.StreamedBodyResponse
	}{}
	m.body.Response = &m.common
	if response {
		m.res.ResponseBody = &m.body
		m.resp.Response = &m.res
	} else {
		m.req.RequestBody = &m.body
		m.resp.Response = &m.req
	}
	if streamed {
		m.piece.Body, m.piece.EndOfStream = piece, eos
		m.streamed.StreamedResponse = &m.piece
		m.mutation.Mutation = &m.streamed
		m.common.BodyMutation = &m.mutation
	}
	return &m.resp, &m.common
}

func contentLength(n int) *corev3.HeaderValueOption {
	return setHeader("content-length", strconv.Itoa(n))
}

// metadataString finds key in a struct, as a string (a list is joined by
// commas, so a list-valued hint reads the same).
func structString(s *structpb.Struct, key string) (string, bool) {
	v, ok := s.GetFields()[key]
	if !ok {
		return "", false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, true
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		parts := make([]string, len(vals))
		for i, e := range vals {
			parts[i] = e.GetStringValue()
		}
		return strings.Join(parts, ","), true
	}
	return "", false
}

// structList reads key as a list of strings: a list value, or a string
// holding a comma-separated list.
func structList(s *structpb.Struct, key string) ([]string, bool) {
	v, ok := s.GetFields()[key]
	if !ok {
		return nil, false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		// An entry may itself be a comma-joined list (as a gateway's
		// header-to-metadata rule writes it); lwepp splits those too.
		out := make([]string, 0, len(k.ListValue.GetValues()))
		for _, e := range k.ListValue.GetValues() {
			out = append(out, splitList(e.GetStringValue())...)
		}
		return out, true
	case *structpb.Value_StringValue:
		return splitList(k.StringValue), true
	}
	return nil, false
}
