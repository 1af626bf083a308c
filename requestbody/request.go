// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Request is what the picker reads from a request body.
type Request struct {
	// Model is the "model" value, unescaped.
	Model string
	// Prompt is the raw JSON of the prompt value as the client sent it: the
	// chat messages array (from its '[') or the completion prompt (a string
	// with its quotes, or an array), cut at the prompt limit. It is a slice
	// of the body, not a copy, capped so that no append writes into the
	// body; the body must not change while it is in use.
	Prompt []byte
	// Stream is true when "stream" is the literal true.
	Stream bool
	// ModelStart and ModelEnd delimit the model value in the body, quotes
	// included, so that RewriteModel touches nothing else; both are 0 when
	// the body has no model.
	ModelStart, ModelEnd int
}

// HasModel reports whether the body has a string model.
func (r *Request) HasModel() bool { return r.ModelEnd > 0 }

// RewriteModel returns a copy of body, the body r was read from, with only
// the model value replaced by target. A body without a model is returned
// as it is.
func (r *Request) RewriteModel(body []byte, target string) []byte {
	if !r.HasModel() {
		return body
	}
	q, _ := json.Marshal(target) // a string always marshals
	out := make([]byte, 0, len(body)-(r.ModelEnd-r.ModelStart)+len(q))
	out = append(out, body[:r.ModelStart]...)
	out = append(out, q...)
	return append(out, body[r.ModelEnd:]...)
}

// Reader reads one request body as it arrives. Scanner is this package's;
// bench/bodyreader holds readers built on JSON libraries that keep the
// same contract, measured against it.
type Reader interface {
	// Feed reads on in body, the body so far: each call's bytes extend the
	// last call's (the buffer may move). final says no more will come. The
	// error, when not nil, is the body's defect: it is final, and more of
	// the body cannot mend it.
	Feed(body []byte, final bool) error
	// Result is what was read once the whole body was fed with final set.
	// An error is a body the picker cannot read on a Strict path: not a
	// JSON object, truncated, invalid, or without a non-empty string
	// model; a gateway answers it 400.
	Result(body []byte) (*Request, error)
}

// Error is a request body the picker cannot read; it maps to a 400.
type Error struct {
	msg string
	// truncated: the defect is that the body ends here; more of it may
	// still come (Scanner).
	truncated bool
	// want, for a body that ends early, is what was to come; the message
	// is made only when asked for, as a body read while it arrives runs
	// out a few times per request and the error is then dropped.
	want string
}

func (e *Error) Error() string {
	if e.want != "" {
		return "invalid JSON: unexpected end of body, want " + e.want
	}
	return e.msg
}

func isTruncation(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.truncated
}

func badBody(format string, args ...any) *Error { return &Error{msg: fmt.Sprintf(format, args...)} }
