// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"net/http"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// Length bounds of the values the picker reads from a stream, in bytes.
// Values that become metric labels (models, objectives) share
// labelvalue.MaxBytes; the others are sized for what legitimately comes
// (Envoy refuses request headers beyond 60 KiB in all).
const (
	maxPathBytes      = 8 << 10 // a path with its query string
	maxAuthorityBytes = 1024    // Kubvernor's ROUTE_route-extsvc-NS.POOL is the longest form
	maxTraceBytes     = 1024    // tracestate: 32 members
	maxIPListBytes    = 4 << 10 // test-epp-endpoint-selection
	maxAddressBytes   = 64      // one "ip:port", IPv6 in brackets included
)

// invalidValue is the 400 for a value the picker acts on that fails
// labelvalue.Check; what names where the value came from.
func invalidValue(what string, err error) *httpError {
	return &httpError{code: http.StatusBadRequest, reason: "InvalidHeader", msg: what + " " + err.Error()}
}

// take reads a header the picker acts on. A value that fails the check is
// returned empty and the stream's first such failure kept, to be answered
// 400 once all headers are read.
func (st *stream) take(hv *corev3.HeaderValue, name string, maxBytes int) string {
	v := headerValue(hv)
	if err := labelvalue.Check(v, maxBytes); err != nil {
		if st.badInput == nil {
			st.badInput = invalidValue("request header "+name, err)
		}
		return ""
	}
	return v
}

// checkValue keeps the stream's first failure of a value read from
// elsewhere than a request header (gRPC metadata, metadata_context,
// attributes) and reports whether v passed.
func (st *stream) checkValue(what, v string, maxBytes int) bool {
	if err := labelvalue.Check(v, maxBytes); err != nil {
		if st.badInput == nil {
			st.badInput = invalidValue(what, err)
		}
		return false
	}
	return true
}
