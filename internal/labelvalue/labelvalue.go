// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package labelvalue checks the values that clients, gateways, model servers
// and objects supply before they become metric labels, log fields, span
// attributes, header values or map keys: valid UTF-8, bounded in length,
// free of control characters.
//
// Prometheus' client panics on a label value that is not valid UTF-8, and
// every distinct value is a series kept until the process ends; a value
// from outside the process is therefore checked once, where it enters, and
// refused (a value the picker acts on) or replaced by a bounded placeholder
// (a value it only records).
package labelvalue

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxBytes is the default length bound of a value: room for a Kubernetes
// object name (253 bytes) and the longest model names in use.
const MaxBytes = 256

// Error says what is wrong with a value, without repeating the value.
type Error struct {
	// Len is the value's length in bytes.
	Len int
	// Max is the bound it was checked against.
	Max int
	// Offset is the byte offset of the first invalid byte or control
	// character, -1 when the value is only too long.
	Offset int
	// Control is set when the byte at Offset starts a control character
	// rather than an invalid UTF-8 sequence.
	Control bool
	// Rune is the control character.
	Rune rune
}

func (e *Error) Error() string {
	switch {
	case e.Offset < 0:
		return fmt.Sprintf("is %d bytes, more than the limit of %d", e.Len, e.Max)
	case e.Control:
		return fmt.Sprintf("holds control character %U at byte %d", e.Rune, e.Offset)
	}
	return fmt.Sprintf("is not valid UTF-8 (at byte %d)", e.Offset)
}

// Check returns nil when v is valid UTF-8 of at most maxBytes bytes (0:
// MaxBytes) with no control character (Unicode category Cc: C0, DEL and
// C1, tab and newlines included), else an *Error. It does not allocate for
// a valid value.
func Check(v string, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = MaxBytes
	}
	if len(v) > maxBytes {
		return &Error{Len: len(v), Max: maxBytes, Offset: -1}
	}
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return &Error{Len: len(v), Max: maxBytes, Offset: i, Control: true, Rune: rune(c)}
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(v[i:])
		if r == utf8.RuneError && n == 1 {
			return &Error{Len: len(v), Max: maxBytes, Offset: i}
		}
		if unicode.IsControl(r) {
			return &Error{Len: len(v), Max: maxBytes, Offset: i, Control: true, Rune: r}
		}
		i += n
	}
	return nil
}

// Valid reports whether Check(v, maxBytes) passes.
func Valid(v string, maxBytes int) bool { return Check(v, maxBytes) == nil }

// quotedPrefixBytes is how much of an invalid value a placeholder shows.
const quotedPrefixBytes = 32

// Placeholder returns v when it passes Check, else a printable stand-in
// that names the value's length and shows its first bytes escaped, such as
// `invalid(3 bytes):"\xff\xfe\xfd"`. The stand-in is valid, and at most
// 4*32+40 bytes whatever v is, so a value that is only recorded (a request
// ID in a log line) never carries the defect further.
func Placeholder(v string, maxBytes int) string {
	if Valid(v, maxBytes) {
		return v
	}
	p := v
	if len(p) > quotedPrefixBytes {
		p = p[:quotedPrefixBytes]
	}
	return "invalid(" + strconv.Itoa(len(v)) + " bytes):" + strconv.QuoteToASCII(p)
}
