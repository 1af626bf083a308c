// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody

import (
	"bytes"
	"errors"
	"unicode/utf8"
)

// Scanner is the package's Reader. It extracts model, prompt (completions)
// or messages (chat), and stream in one pass. The prompt is the value's
// JSON encoding as the client sent it, up to the prompt limit (the
// scheduler reads no more), sliced from the body without copying or
// unescaping: the prefix-cache scorer only hashes it, and what prefix
// caching needs is that requests sharing a conversation prefix share prompt
// bytes, which holds for clients that serialize the same messages the same
// way. Different serializations of the same text (key order, escapes,
// spacing) hash differently, so they do not share cache entries; turning
// the JSON into text would cost a copy of every prompt to catch that rare
// case.
//
// Everything the picker reads is validated: the top-level object and all
// its keys (model or stream may come after a huge messages array), model,
// stream, and the prompt up to the limit; so are the other values until the
// prompt is full. Once it is (at once for paths that carry no prompt, or a
// limit of 0), the rest of the prompt and any other value are only skimmed:
// strings end at the next quote preceded by an even number of backslashes,
// arrays and objects at the bracket that closes them. That is the point of
// the limit: a 64 KiB prompt costs what its used 16 KiB cost, not a full
// validation. The trade-off: a body whose only defect lies in skimmed bytes
// (a bad escape, a control byte, a bad number inside a skimmed array) is
// forwarded unchanged and the model server rejects it. A body that is not a
// JSON object, ends inside a value (truncated), or has no string model is
// still a 400.
//
// Fed the body as it arrives, it resumes where the previous call ran out,
// so the work of reading the body is done while it arrives and, when the
// last piece comes, little is left to read. It reads the same bytes in the
// same order as a single call on the whole body, so its result and errors
// are the same. A member that is read whole (not skimmed) and ran out is
// read again from its key once the body has grown by as much as the member
// had, so a defect in it is found once at most twice its bytes are in, and
// the work stays linear in the body however it is cut.
type Scanner struct {
	kind  Kind
	limit int
	out   Request
	// promptStart and promptEnd delimit the prompt (already cut at limit)
	// in the body, when hasPrompt; offsets, because the buffer holding the
	// body may move as it grows.
	promptStart, promptEnd int
	hasPrompt              bool
	// promptDone: everything the picker wants from values other than model
	// and stream has been read, so those can be skimmed.
	promptDone bool

	step scanStep
	// i is where step resumes.
	i int
	// retryAt is the body length at which a member that ran out is read
	// again (see Feed).
	retryAt int
	// During stepSkim: where the skim is, and where it began.
	skim      skimState
	skimStart int
	keyBuf    []byte // unescaped keys
	// err is the first defect found; the scanner stops there.
	err error
	// closed: the top-level object is complete, and only whitespace has
	// followed so far.
	closed bool
	// skimmed, when set (by tests), is told each byte range that was only
	// skimmed, not validated, where a defect goes unnoticed.
	skimmed func(start, end int)
}

// scanStep is where the scanner is in the top-level object.
type scanStep int

const (
	// stepOpen: before the top-level '{' (and the first key, or '}').
	stepOpen scanStep = iota
	// stepMember: at a member's key; the member is read whole or, when the
	// body runs out inside it, read again from its key once it has grown.
	stepMember
	// stepSkim: inside a skimmed value (or a prompt's skimmed tail), which
	// resumes where it ran out: values skimmed are the long ones.
	stepSkim
	// stepAfterValue: after a member's value, at its ',' or '}'.
	stepAfterValue
	// stepClosed: after the top-level object; only whitespace may follow.
	stepClosed
)

// NewScanner returns a Scanner for a body on a path of this kind, whose
// prompt is cut at promptLimit bytes (negative: 0).
func NewScanner(kind Kind, promptLimit int) *Scanner {
	promptLimit = max(promptLimit, 0)
	return &Scanner{kind: kind, limit: promptLimit, promptDone: promptLimit == 0 || !kind.hasPrompt()}
}

// Feed reads on in b, the body so far; final says no more bytes will come.
// It reports the first defect (always an *Error), which is final: Feed does
// nothing after it.
func (sc *Scanner) Feed(b []byte, final bool) error {
	if sc.err != nil {
		return sc.err
	}
	if !final && len(b) < sc.retryAt {
		return nil // the member that ran out has not grown enough to read again
	}
	for {
		ranOut, err := sc.advance(b, final)
		if err != nil {
			if final || !isTruncation(err) {
				sc.err = err
				return err
			}
			// The rest of the member is not in yet. It is read again from
			// its key, so only once its bytes have doubled: re-reading it
			// at every chunk would cost the square of its length (the
			// performance page has a 4 MiB member's cost); doubling costs
			// at most twice.
			sc.retryAt = len(b) + (len(b) - sc.i)
			return nil
		}
		if ranOut {
			return nil
		}
	}
}

// Result is what the scanner read once the whole body b was fed with final
// set; an error is the body's defect (a 400). On a path that is not Strict
// a body that is not a JSON object is no error: the result is empty.
func (sc *Scanner) Result(b []byte) (*Request, error) {
	if sc.err == nil && !sc.closed {
		sc.err = syntaxErr(b, len(b), "more of the body") // fed without final
	}
	if sc.err != nil {
		if !sc.kind.Strict() {
			return &Request{}, nil
		}
		return nil, sc.err
	}
	if !sc.out.HasModel() && sc.kind.Strict() {
		return nil, badBody(`request body has no "model" field`)
	}
	out := sc.out
	if sc.hasPrompt {
		// Capped so that no append can write into the body.
		out.Prompt = b[sc.promptStart:sc.promptEnd:sc.promptEnd]
	}
	return &out, nil
}

// advance takes one step; ranOut means it needs more of the body (or, with
// final, that the body is done). A truncation error when not final means
// the step is to be taken again, from where it began, once b has grown.
func (sc *Scanner) advance(b []byte, final bool) (ranOut bool, err error) {
	switch sc.step {
	case stepOpen:
		i := skipWS(b, 0)
		if i >= len(b) {
			if final {
				return true, badBody("request body is empty, want a JSON object")
			}
			return true, nil
		}
		if b[i] != '{' {
			return true, badBody("request body is not a JSON object (starts with %q at offset %d)", b[i], i)
		}
		i = skipWS(b, i+1)
		switch {
		case i >= len(b):
			return true, syntaxErr(b, i, "object key")
		case b[i] == '}':
			sc.step, sc.i, sc.closed = stepClosed, i+1, true
		default:
			sc.step, sc.i = stepMember, i
		}
		return false, nil
	case stepMember:
		return false, sc.member(b, final)
	case stepSkim:
		end, done := sc.skim.run(b, sc.i)
		if !done {
			sc.i = end
			if final {
				return true, sc.skim.err(b)
			}
			return true, nil
		}
		if sc.skimmed != nil {
			sc.skimmed(sc.skimStart, end)
		}
		sc.step, sc.i = stepAfterValue, end
		return false, nil
	case stepAfterValue:
		next, more, err := nextMember(b, sc.i, '}')
		if err != nil {
			return true, err
		}
		if more {
			sc.step, sc.i = stepMember, next
		} else {
			sc.step, sc.i, sc.closed = stepClosed, next, true
		}
		return false, nil
	}
	// stepClosed
	i := skipWS(b, sc.i)
	if i != len(b) {
		sc.closed = false
		return true, badBody("invalid JSON: data after the top-level object at offset %d", i)
	}
	sc.i = i
	return true, nil
}

// member reads the member at sc.i: its key, then its value, which is read
// as the prompt, skimmed, or validated (and recorded when the picker reads
// it).
func (sc *Scanner) member(b []byte, final bool) error {
	// Whitespace before the key may have come after the step was set.
	i := skipWS(b, sc.i)
	if i >= len(b) || b[i] != '"' {
		return syntaxErr(b, i, "object key")
	}
	v := validator{b: b, stop: neverStop}
	end, err := v.str(i, 0)
	if err != nil {
		return err
	}
	key := b[i+1 : end-1]
	if bytes.IndexByte(key, '\\') >= 0 {
		// Into a buffer of its own: appending to a slice of b would write
		// over the body, which is forwarded.
		sc.keyBuf = appendUnescaped(sc.keyBuf[:0], key)
		key = sc.keyBuf
	}
	i = skipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		return syntaxErr(b, i, "':' after object key")
	}
	vs := skipWS(b, i+1)
	if vs >= len(b) {
		return syntaxErr(b, vs, "a value")
	}
	k := string(key)
	prompt := sc.kind.HoldsPrompt(k)
	switch {
	case prompt && k == "messages" && b[vs] != '[':
		// Said before the value is read: it may be long, and no more of it
		// can mend this.
		return badBody(`"messages" must be an array`)
	case k == "model" && b[vs] != '"':
		return badBody(`"model" must be a string`)
	case prompt:
		return sc.prompt(b, vs, k == "messages", final)
	case sc.promptDone && !sc.kind.reads(k) && (b[vs] == '"' || b[vs] == '[' || b[vs] == '{'):
		if b[vs] == '"' {
			sc.skim = skimState{inString: true}
		} else {
			sc.skim = skimState{depth: 1}
		}
		sc.step, sc.i, sc.skimStart = stepSkim, vs+1, vs+1
		return nil
	}
	ve, err := v.value(vs, 1)
	if err != nil {
		return err
	}
	if ve == len(b) && !final {
		// A number may go on in the next piece.
		return syntaxErr(b, ve, "more of the value")
	}
	if err := sc.field(k, b[vs:ve], vs); err != nil {
		return err
	}
	sc.step, sc.i = stepAfterValue, ve
	return nil
}

// prompt reads the prompt value at b[vs] (messages: an array of objects):
// validated up to the first point at or past vs+limit where skimming can
// take over (before an element or key, or inside a string outside an
// escape), then skimmed to its end. It is cut at limit bytes. Until the
// body holds limit bytes of it (or all of it), reading waits, so that the
// cut is where it would be in the whole body.
func (sc *Scanner) prompt(b []byte, vs int, messages, final bool) error {
	v := validator{b: b, stop: vs + sc.limit, messages: messages}
	if sc.limit > len(b)-vs {
		if !final {
			return syntaxErr(b, len(b), "more of the prompt")
		}
		v.stop = neverStop
	}
	end, err := v.value(vs, 1)
	switch {
	case errors.Is(err, errPromptFull):
		sc.promptStart, sc.promptEnd, sc.hasPrompt, sc.promptDone = vs, vs+sc.limit, true, true
		sc.skim = skimState{depth: v.open, inString: v.inString}
		sc.step, sc.i, sc.skimStart = stepSkim, end, end
		return nil
	case err != nil:
		return err
	case end == len(b) && !final:
		return syntaxErr(b, end, "more of the value")
	}
	cut := end
	if end-vs > sc.limit {
		cut = vs + sc.limit
	}
	sc.promptStart, sc.promptEnd, sc.hasPrompt = vs, cut, true
	sc.promptDone = cut-vs >= sc.limit
	sc.step, sc.i = stepAfterValue, end
	return nil
}

// field records one validated top-level member; later duplicates win, as
// in encoding/json.
func (sc *Scanner) field(key string, raw []byte, offset int) error {
	switch key {
	case "model":
		m := string(raw[1 : len(raw)-1])
		if bytes.IndexByte(raw, '\\') >= 0 {
			m = string(appendUnescaped(nil, raw[1:len(raw)-1]))
		}
		if !utf8.ValidString(m) {
			// encoding/json would silently turn it into U+FFFD and model
			// servers reject it; a model name must be text.
			return badBody(`"model" is not valid UTF-8`)
		}
		if m == "" && sc.kind.Strict() {
			return badBody(`"model" is empty`)
		}
		sc.out.Model, sc.out.ModelStart, sc.out.ModelEnd = m, offset, offset+len(raw)
	case "stream":
		sc.out.Stream = string(raw) == "true"
	}
	return nil
}
