// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package bodyreader

import (
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/requestbody"
	"github.com/poolpicker/poolpicker/requestbody/requestbodytest"
)

var readers = []struct {
	name string
	new  func(requestbody.Kind, int) requestbody.Reader
}{{"gjson", GJSON}, {"jsontext", JSONText}}

func TestReaders(t *testing.T) {
	for _, r := range readers {
		t.Run(r.name, func(t *testing.T) { requestbodytest.Suite{New: r.new}.Run(t) })
	}
}

// TestDeepNesting: a body nested far deeper than any reader allows is a
// 400, not a crash.
func TestDeepNesting(t *testing.T) {
	body := []byte(`{"model":"m","x":` + strings.Repeat("[", 4<<20) + strings.Repeat("]", 4<<20) + `}`)
	for _, r := range readers {
		if _, err := requestbodytest.Read(r.new(requestbody.Chat, 0), body); err == nil {
			t.Errorf("%s: read a body nested 4 Mi deep", r.name)
		}
	}
}

func BenchmarkReaders(b *testing.B) {
	b.Run("scanner", func(b *testing.B) {
		requestbodytest.Benchmark(b, func(k requestbody.Kind, l int) requestbody.Reader { return requestbody.NewScanner(k, l) })
	})
	for _, r := range readers {
		b.Run(r.name, func(b *testing.B) { requestbodytest.Benchmark(b, r.new) })
	}
}
