// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody

// Parse reads a whole body with a Scanner, the reference the scanner's
// tests compare a body fed in pieces against.
func Parse(body []byte, kind Kind, promptLimit int) (*Request, error) {
	sc := NewScanner(kind, promptLimit)
	_ = sc.Feed(body, true) // the defect, if any, is Result's error
	return sc.Result(body)
}

// ParseSkimming is Parse that also returns the byte ranges it only
// skimmed, where a defect goes unnoticed.
func ParseSkimming(body []byte, kind Kind, promptLimit int) (*Request, [][2]int, error) {
	var skimmed [][2]int
	sc := NewScanner(kind, promptLimit)
	sc.skimmed = func(start, end int) { skimmed = append(skimmed, [2]int{start, end}) }
	_ = sc.Feed(body, true)
	rb, err := sc.Result(body)
	return rb, skimmed, err
}

// ErrPromptFull never leaves the package.
var ErrPromptFull = errPromptFull
