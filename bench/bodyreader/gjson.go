// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package bodyreader

import (
	"bytes"
	"errors"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/poolpicker/poolpicker/requestbody"
)

// GJSON returns a Reader built on github.com/tidwall/gjson.
func GJSON(kind requestbody.Kind, promptLimit int) requestbody.Reader {
	return &whole{kind: kind, limit: max(promptLimit, 0), members: gjsonMembers}
}

// maxDepth is requestbody's nesting bound. gjson's validator recurses once
// per level, so without it a body of a few MiB of '[' exhausts the stack.
const maxDepth = 512

func gjsonMembers(w *whole, body []byte) error {
	if tooDeep(body) {
		return errors.New("invalid JSON: nesting too deep")
	}
	if !gjson.ValidBytes(body) {
		return errors.New("invalid JSON")
	}
	// gjson.ParseBytes copies the body into a string; the body does not
	// change while it is read, so a string over its bytes does as well.
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	var err error
	doc.ForEach(func(k, v gjson.Result) bool {
		raw := body[v.Index : v.Index+len(v.Raw)]
		switch key := k.Str; {
		case key == "model":
			err = w.model(raw, v.Index, v.Str)
		case key == "stream":
			w.out.Stream = v.Type == gjson.True
		case w.kind.HoldsPrompt(key):
			objects := true
			v.ForEach(func(_, e gjson.Result) bool {
				objects = e.IsObject()
				return objects
			})
			err = w.prompt(key, raw, objects)
		}
		return err == nil
	})
	return err
}

// tooDeep reports whether arrays and objects nest deeper than maxDepth in
// the valid-looking prefix of b (brackets inside strings do not count).
func tooDeep(b []byte) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			// To the closing quote: one preceded by an even number of
			// backslashes.
			for {
				k := bytes.IndexByte(b[i+1:], '"')
				if k < 0 {
					return false
				}
				i += 1 + k
				p := i
				for b[p-1] == '\\' {
					p--
				}
				if (i-p)%2 == 0 {
					break
				}
			}
		case '[', '{':
			if depth++; depth > maxDepth {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}
