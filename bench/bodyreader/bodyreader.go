// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package bodyreader implements requestbody.Reader on two maintained JSON
// libraries, gjson and jsontext, so that bench/extproc can measure
// requestbody.Scanner against them end to end.
//
// Both pass requestbodytest's suite. A library parses a whole document, so
// these readers do nothing while the body arrives and read it once it is
// complete; and they validate all of it, so a body whose only defect lies
// past the prompt limit is refused (400) rather than forwarded.
package bodyreader

import (
	"errors"
	"unicode/utf8"

	"github.com/poolpicker/poolpicker/requestbody"
)

// whole is what both readers share: the picker's rules, applied to the
// top-level members a library found, worded as requestbody words them.
type whole struct {
	kind  requestbody.Kind
	limit int
	// members walks the complete body with a library, calling member for
	// every top-level member; its error is a JSON syntax error.
	members func(w *whole, body []byte) error
	out     requestbody.Request
}

func (w *whole) Feed(body []byte, final bool) error { return nil }

func (w *whole) Result(body []byte) (*requestbody.Request, error) {
	err := w.read(body)
	if err != nil {
		if !w.kind.Strict() {
			return &requestbody.Request{}, nil
		}
		return nil, err
	}
	out := w.out
	return &out, nil
}

func (w *whole) read(body []byte) error {
	i := 0
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	switch {
	case i == len(body):
		return errors.New("request body is empty, want a JSON object")
	case body[i] != '{':
		return errors.New("request body is not a JSON object")
	}
	if err := w.members(w, body); err != nil {
		return err
	}
	if !w.out.HasModel() && w.kind.Strict() {
		return errors.New(`request body has no "model" field`)
	}
	return nil
}

// model records the model, whose raw JSON is raw at offset, unescaped to
// text.
func (w *whole) model(raw []byte, offset int, text string) error {
	switch {
	case raw[0] != '"':
		return errors.New(`"model" must be a string`)
	case !utf8.ValidString(text):
		return errors.New(`"model" is not valid UTF-8`)
	case text == "" && w.kind.Strict():
		return errors.New(`"model" is empty`)
	}
	w.out.Model, w.out.ModelStart, w.out.ModelEnd = text, offset, offset+len(raw)
	return nil
}

// prompt records the prompt, whose raw JSON is raw (a slice of the body);
// objects says whether each element of an array value is an object.
func (w *whole) prompt(key string, raw []byte, objects bool) error {
	if key == "messages" {
		if raw[0] != '[' {
			return errors.New(`"messages" must be an array`)
		}
		if !objects {
			return errors.New(`each of "messages" must be an object`)
		}
	}
	n := min(len(raw), w.limit)
	w.out.Prompt = raw[:n:n]
	return nil
}
