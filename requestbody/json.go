// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxJSONDepth = 512

// neverStop is a validator's stop when it is to validate the whole value.
const neverStop = math.MaxInt

// validator validates JSON values in b. It stops at offset stop (the
// prompt limit) with errPromptFull, saying how many arrays and objects are
// open there and whether it stopped inside a string, so that a skim can
// find the value's end.
type validator struct {
	b        []byte
	stop     int
	messages bool // the value is chat messages: an array of objects
	open     int
	inString bool
}

// errPromptFull stops validating once the prompt is full; the offset
// returned with it is where skimming takes over. It never leaves the
// package.
var errPromptFull = &Error{msg: "prompt full"}

func (v *validator) full(i, open int, inString bool) (int, error) {
	v.open, v.inString = open, inString
	return i, errPromptFull
}

// value validates the value at b[i], depth deep (a top-level member's value
// is 1), and returns the offset just past it.
func (v *validator) value(i, depth int) (int, error) {
	b := v.b
	if i >= len(b) {
		return i, syntaxErr(b, i, "a value")
	}
	switch c := b[i]; {
	case c == '"':
		return v.str(i, depth-1)
	case c == '[':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			if i >= v.stop {
				return v.full(i, depth, false)
			}
			if v.messages && depth == 1 && (i >= len(b) || b[i] != '{') {
				if i >= len(b) {
					return i, syntaxErr(b, i, "a value")
				}
				return i, badBody(`each of "messages" must be an object`)
			}
			var err error
			if i, err = v.value(i, depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, ']'); err != nil || !more {
				return i, err
			}
		}
	case c == '{':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= v.stop {
				return v.full(i, depth, false)
			}
			if i >= len(b) || b[i] != '"' {
				return i, syntaxErr(b, i, "object key")
			}
			var err error
			if i, err = v.str(i, depth); err != nil {
				return i, err
			}
			i = skipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, syntaxErr(b, i, "':' after object key")
			}
			i = skipWS(b, i+1)
			if i >= v.stop {
				return v.full(i, depth, false)
			}
			if i, err = v.value(i, depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, '}'); err != nil || !more {
				return i, err
			}
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return number(b, i)
	}
	return i, syntaxErr(b, i, "a value")
}

// str validates the string at b[i] (a quote), inside open arrays and
// objects, and returns the offset past its closing quote.
func (v *validator) str(i, open int) (int, error) {
	b := v.b
	// Bytes from stop on are skimmed, not validated: look no further.
	lim := min(len(b), v.stop)
	i++
	for {
		j := validRun(b, i, lim)
		if j >= lim && lim == v.stop {
			// j, at or past stop, is not inside an escape.
			return v.full(j, open, true)
		}
		if j >= len(b) {
			return j, syntaxErr(b, j, "closing '\"'")
		}
		switch b[j] {
		case '"':
			return j + 1, nil
		case '\\':
			n, err := escapeLen(b, j)
			if err != nil {
				return j, err
			}
			i = j + n
		default: // below 0x20
			return j, badBody("invalid JSON at offset %d: control character in string", j)
		}
	}
}

// validRun returns the offset of the first byte at or after b[i], and
// below lim (at most len(b)), that ends a run of plain bytes and two-byte
// escapes: a '"', a byte below 0x20, or a backslash starting any other
// escape (\u, a bad one, or one cut by the end of b). With none, it returns
// where the run's last escape ends, at or past lim. Prompts are plain bytes
// with an escape every few words (\n, \"), so it tests eight bytes at a
// time and reads the escapes it meets without leaving the word.
func validRun(b []byte, i, lim int) int {
	for i+8 <= lim {
		m := exactSpecialMask(binary.LittleEndian.Uint64(b[i:]))
		next := i + 8
		for m != 0 {
			k := i + bits.TrailingZeros64(m)>>3
			m &= m - 1
			if b[k] != '\\' || k+1 >= len(b) || !shortEscape[b[k+1]] {
				return k
			}
			if k+1 < i+8 {
				m &^= 0x80 << (8 * uint(k+1-i)) // the escaped byte is no special
			} else {
				next = k + 2
			}
		}
		i = next
	}
	for i < lim {
		switch c := b[i]; {
		case c == '"' || c < 0x20:
			return i
		case c == '\\':
			if i+1 >= len(b) || !shortEscape[b[i+1]] {
				return i
			}
			i += 2
		default:
			i++
		}
	}
	return i
}

// exactSpecialMask sets the high bit of every byte of w that is '"', '\\'
// or below 0x20, and no other bit (SWAR without borrows between bytes).
func exactSpecialMask(w uint64) uint64 {
	// Per byte, with l its low seven bits: (l ^ '"') + 0x7f, (l ^ '\\') +
	// 0x7f and l + 0x60 each reach bit 7 unless the byte is '"', '\\' or
	// below 0x20 respectively (none carries out of the byte); a byte with
	// bit 7 set is none of them. So the bytes whose bit 7 stays clear in
	// the AND of the three, ORed with w, are the special ones.
	l := w & low7
	plain := ((l ^ (lsb * '"')) + low7) & ((l ^ (lsb * '\\')) + low7) & (l + lsb*0x60)
	return ^(plain | w) & msb
}

// zeroByteBits sets bit 7 of every zero byte of x and clears it in the
// others; the low seven bits of each byte are left to masking with msb,
// once, by the caller.
func zeroByteBits(x uint64) uint64 {
	return ^(((x & low7) + low7) | x)
}

// shortEscape marks the bytes that make a valid two-byte escape after a
// backslash; prompts are full of them (\n, \"), so they are read inline.
var shortEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// skimState is where a skim is: how many arrays and objects are open and
// whether it is inside a string (innermost). A skim does not validate: it
// only finds where strings and brackets end, which is enough to locate the
// next top-level key.
type skimState struct {
	depth    int
	inString bool
}

// run skims b from i, which must not be in the middle of an escape. done:
// end is just past the skimmed value. Otherwise the body ran out and end
// is where to resume once it has grown.
func (s *skimState) run(b []byte, i int) (end int, done bool) {
	if s.inString {
		j, closed := skimString(b, i)
		if !closed {
			return j, false
		}
		i, s.inString = j, false
		if s.depth == 0 {
			return i, true
		}
	}
	for i < len(b) {
		switch b[i] {
		case '"':
			j, closed := skimString(b, i+1)
			if !closed {
				s.inString = true
				return j, false
			}
			i = j
			continue
		case '[', '{':
			s.depth++
		case ']', '}':
			s.depth--
			if s.depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return i, false
}

// err is the defect of a body that ends during the skim: it is truncated.
func (s *skimState) err(b []byte) error {
	if s.inString {
		return syntaxErr(b, len(b), "closing '\"'")
	}
	return badBody("invalid JSON: unexpected end of body, want ']' or '}' (%d left open)", s.depth)
}

// skimString returns the offset past the closing quote of the string that
// b[i] is inside of, with closed set; b[i] must not be in the middle of an
// escape. A quote is the closing one when an even number of backslashes
// precede it (each pair is an escaped backslash). When b ends first, the
// offset is where to resume: before the backslashes b ends with, so that
// they are counted with the quote that may follow.
func skimString(b []byte, i int) (int, bool) {
	from := i
	// Quotes come in clusters (escaped quotes in code and dialogue), where
	// bytes.IndexByte's setup outweighs its speed: words of eight bytes are
	// tested in place until a stretch of them holds no quote, then
	// IndexByte takes the long hop.
	quiet := 0
	for {
		var q int
		if quiet < quietWords && i+8 <= len(b) {
			m := exactQuoteMask(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 {
				i += 8
				quiet++
				continue
			}
			quiet = 0
			for {
				q = i + bits.TrailingZeros64(m)>>3
				if closingQuote(b, from, q) {
					return q + 1, true
				}
				if m &= m - 1; m == 0 {
					break
				}
			}
			i += 8
			continue
		}
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			r := len(b)
			for r > from && b[r-1] == '\\' {
				r--
			}
			return r, false
		}
		q = i + k
		if closingQuote(b, from, q) {
			return q + 1, true
		}
		i, quiet = q+1, 0
	}
}

// quietWords is how many quote-free words skimString tests before handing
// the rest of the hop to bytes.IndexByte.
const quietWords = 8

// closingQuote reports whether the quote at b[q] ends the string that began
// at from: an even number of backslashes precede it (each pair is an
// escaped backslash).
func closingQuote(b []byte, from, q int) bool {
	// One backslash or none, as in \" and ", is nearly every case.
	if q == from || b[q-1] != '\\' {
		return true
	}
	if q-1 == from || b[q-2] != '\\' {
		return false
	}
	p := q - 2
	for p > from && b[p-1] == '\\' {
		p--
	}
	return (q-p)%2 == 0
}

// exactQuoteMask sets the high bit of every '"' byte of w and no other bit.
func exactQuoteMask(w uint64) uint64 { return zeroByteBits(w^(lsb*'"')) & msb }

func syntaxErr(b []byte, i int, want string) *Error {
	if i >= len(b) {
		return &Error{want: want, truncated: true}
	}
	return badBody("invalid JSON at offset %d: unexpected %q, want %s", i, b[i], want)
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// nextMember moves past what follows a member of an array or object closed
// by close: a ',' (more members follow, at next) or close itself (next is
// just past it).
func nextMember(b []byte, i int, close byte) (next int, more bool, err error) {
	i = skipWS(b, i)
	if i < len(b) {
		switch b[i] {
		case ',':
			return skipWS(b, i+1), true, nil
		case close:
			return i + 1, false, nil
		}
	}
	return i, false, syntaxErr(b, i, "',' or '"+string(close)+"'")
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	err := syntaxErr(b, i, lit)
	err.truncated = len(b)-i < len(lit) && string(b[i:]) == lit[:len(b)-i]
	return i, err
}

func number(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return i, syntaxErr(b, i, "a digit")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return i, syntaxErr(b, i, "a digit")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, syntaxErr(b, i, "a digit")
		}
	}
	return i, nil
}

// escapeLen validates the escape at b[i] (a backslash) and returns its length.
func escapeLen(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, syntaxErr(b, len(b), "escape")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) {
			err := badBody("invalid JSON at offset %d: bad \\u escape", i)
			err.truncated = isHex4(b[i+2:]) // hex so far: the rest may follow
			return 0, err
		}
		if !isHex4(b[i+2 : i+6]) {
			return 0, badBody("invalid JSON at offset %d: bad \\u escape", i)
		}
		return 6, nil
	}
	return 0, badBody("invalid JSON at offset %d: bad escape \\%c", i, b[i+1])
}

const (
	lsb  = 0x0101010101010101
	msb  = 0x8080808080808080
	low7 = 0x7f7f7f7f7f7f7f7f
)

func isHex4(h []byte) bool {
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// appendUnescaped appends the text of a validated JSON string's contents
// (no quotes) to dst. A lone surrogate becomes U+FFFD, as in encoding/json.
func appendUnescaped(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			j := len(s)
			if k := bytes.IndexByte(s[i+1:], '\\'); k >= 0 {
				j = i + 1 + k
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		switch c := s[i+1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if d := utf16.DecodeRune(r, hex4(s[i+2:i+6])); d != utf8.RuneError {
					r = d
					i += 6
				}
			}
			if utf16.IsSurrogate(r) {
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
		i += 2
	}
	return dst
}

// hex4 is the value of four validated hex digits.
func hex4(h []byte) rune {
	n, _ := strconv.ParseUint(string(h), 16, 32)
	return rune(n)
}
