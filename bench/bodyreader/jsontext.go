// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package bodyreader

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/poolpicker/poolpicker/requestbody"
)

// JSONText returns a Reader built on github.com/go-json-experiment/json's
// jsontext (the future encoding/json/jsontext).
func JSONText(kind requestbody.Kind, promptLimit int) requestbody.Reader {
	return &whole{kind: kind, limit: max(promptLimit, 0), members: jsontextMembers}
}

// decoder is a jsontext.Decoder reading from buf, which it parses in place
// (it does not copy a bytes.Buffer's contents); both are reused.
type decoder struct {
	buf bytes.Buffer
	dec jsontext.Decoder
}

var decoders = sync.Pool{New: func() any { return new(decoder) }}

func jsontextMembers(w *whole, body []byte) error {
	d := decoders.Get().(*decoder)
	defer decoders.Put(d)
	d.buf = *bytes.NewBuffer(body)
	// Duplicate names (the last wins) and invalid UTF-8 are what
	// encoding/json and model servers accept; model must still be UTF-8.
	d.dec.Reset(&d.buf, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	dec := &d.dec
	if _, err := dec.ReadToken(); err != nil { // '{', as read checked
		return err
	}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		switch key := tok.String(); {
		case key == "model":
			v, err := dec.ReadValue()
			if err != nil {
				return err
			}
			end := int(dec.InputOffset())
			raw := body[end-len(v) : end]
			var text []byte
			if raw[0] == '"' {
				if text, err = jsontext.AppendUnquote(nil, raw); err != nil {
					return err
				}
			}
			if err := w.model(raw, end-len(v), string(text)); err != nil {
				return err
			}
		case key == "stream":
			v, err := dec.ReadValue()
			if err != nil {
				return err
			}
			w.out.Stream = string(v) == "true"
		case w.kind.HoldsPrompt(key):
			if err := jsontextPrompt(w, dec, body, key); err != nil {
				return err
			}
		default:
			if err := dec.SkipValue(); err != nil {
				return err
			}
		}
	}
	if _, err := dec.ReadToken(); err != nil { // '}'
		return err
	}
	if _, err := dec.ReadValue(); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("invalid JSON: data after the top-level object")
		}
		return err
	}
	return nil
}

// jsontextPrompt reads the prompt value, telling whether an array's
// elements are all objects as it goes.
func jsontextPrompt(w *whole, dec *jsontext.Decoder, body []byte, key string) error {
	if dec.PeekKind() != '[' {
		v, err := dec.ReadValue()
		if err != nil {
			return err
		}
		end := int(dec.InputOffset())
		return w.prompt(key, body[end-len(v):end], false)
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	start := int(dec.InputOffset()) - 1 // the '['
	objects := true
	for dec.PeekKind() != ']' {
		objects = objects && dec.PeekKind() == '{'
		if err := dec.SkipValue(); err != nil {
			return err
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	return w.prompt(key, body[start:dec.InputOffset()], objects)
}
