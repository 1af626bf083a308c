// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestExactSpecialMask compares the SWAR mask with a byte-by-byte test on
// every byte value in every position, among other bytes that are special
// or not, and on random words.
func TestExactSpecialMask(t *testing.T) {
	special := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	check := func(w uint64) {
		t.Helper()
		var want uint64
		for k := 0; k < 8; k++ {
			if special(byte(w >> (8 * k))) {
				want |= 0x80 << (8 * k)
			}
		}
		if got := exactSpecialMask(w); got != want {
			t.Fatalf("word %016x: mask %016x, want %016x", w, got, want)
		}
	}
	for _, fill := range []byte{'a', 0, '"', '\\', 0x1f, 0x20, 0x7f, 0x80, 0xff} {
		for p := 0; p < 8; p++ {
			for v := 0; v < 256; v++ {
				w := lsb * uint64(fill)
				w = w&^(0xff<<(8*p)) | uint64(v)<<(8*p)
				check(w)
			}
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(rnd.Uint64())
	}
}

// TestValidRun checks where a run of plain bytes and two-byte escapes ends,
// with escapes across the eight-byte words it tests.
func TestValidRun(t *testing.T) {
	cases := []struct {
		s    string
		lim  int // -1: len(s)
		want int
	}{
		{`abcdefghijklmnop"`, -1, 16},
		{`abcdefg\"hijklmn"`, -1, 16},             // escape across words
		{`abcdef\\"`, -1, 8},                      // an escaped backslash, then the end
		{`\n\t\"\\\/\b\f\rxyz"`, -1, 19},          // every two-byte escape
		{`abcdefgh\u0041"`, -1, 8},                // \u is for the caller
		{`abcdefgh\x"`, -1, 8},                    // a bad escape too
		{`abcdefg\`, -1, 7},                       // cut after the backslash
		{"abc\x01def", -1, 3},                     // a control byte
		{`abcdefghijklmnop`, -1, 16},              // runs out
		{`abcdefghijklmnop`, 5, 5},                // stops at lim
		{`abcd\nefghijklmnop`, 5, 6},              // an escape across lim ends past it
		{`abcdefghijklmnopqrstuvw\"xyz"`, 24, 25}, // the same in the word loop
	}
	for _, c := range cases {
		lim := c.lim
		if lim < 0 {
			lim = len(c.s)
		}
		if got := validRun([]byte(c.s), 0, lim); got != c.want {
			t.Errorf("validRun(%q, lim %d) = %d, want %d", c.s, lim, got, c.want)
		}
	}
}

// TestSkimStringAgainstIndexByte holds skimString, which tests words in
// place before handing long hops to bytes.IndexByte, to the plain loop over
// IndexByte it replaced, on random strings dense in quotes and backslashes,
// whole and cut short.
func TestSkimStringAgainstIndexByte(t *testing.T) {
	reference := func(b []byte, i int) (int, bool) {
		from := i
		for {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				r := len(b)
				for r > from && b[r-1] == '\\' {
					r--
				}
				return r, false
			}
			q := i + k
			p := q
			for p > from && b[p-1] == '\\' {
				p--
			}
			if (q-p)%2 == 0 {
				return q + 1, true
			}
			i = q + 1
		}
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte(`"\\ab`)
	for n := 0; n < 200000; n++ {
		b := make([]byte, rnd.IntN(300))
		density := 2 + rnd.IntN(200) // one special byte in about density
		for i := range b {
			if rnd.IntN(density) == 0 {
				b[i] = alphabet[rnd.IntN(2)]
			} else {
				b[i] = alphabet[2+rnd.IntN(2)]
			}
		}
		start := 0
		if len(b) > 0 {
			start = rnd.IntN(len(b))
			for start > 0 && b[start-1] == '\\' { // not inside an escape
				start--
			}
		}
		gotEnd, gotClosed := skimString(b, start)
		wantEnd, wantClosed := reference(b, start)
		if gotEnd != wantEnd || gotClosed != wantClosed {
			t.Fatalf("skimString(%q, %d) = %d, %v; want %d, %v", b, start, gotEnd, gotClosed, wantEnd, wantClosed)
		}
	}
}
