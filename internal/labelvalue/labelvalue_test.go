// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package labelvalue

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, v string
		max     int
		want    string // "" valid; else a part of the error
	}{
		{"empty", "", 0, ""},
		{"model", "meta-llama/Llama-3.1-8B-Instruct", 0, ""},
		{"unicode", "modèle-日本語", 0, ""},
		{"at the bound", strings.Repeat("a", MaxBytes), 0, ""},
		{"over the default bound", strings.Repeat("a", MaxBytes+1), 0, "257 bytes, more than the limit of 256"},
		{"over a given bound", "abcd", 3, "4 bytes, more than the limit of 3"},
		{"invalid UTF-8", "\xff\xfe\xfd", 0, "not valid UTF-8 (at byte 0)"},
		{"truncated rune", "ab\xe6\x97", 0, "not valid UTF-8 (at byte 2)"},
		{"surrogate", "a\xed\xa0\x80", 0, "not valid UTF-8 (at byte 1)"},
		{"NUL", "a\x00b", 0, "control character U+0000 at byte 1"},
		{"newline", "a\nb", 0, "U+000A"},
		{"tab", "\tb", 0, "U+0009"},
		{"DEL", "a\x7f", 0, "U+007F"},
		{"C1", "a\u0085", 0, "U+0085 at byte 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.v, tc.max)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want nil", tc.v, err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check(%q) = %v, want an *Error saying %q", tc.v, err, tc.want)
			}
		})
	}
}

// TestPlaceholderIsALabel checks that what Placeholder returns for any
// value is accepted by Prometheus as a label value (the client panics on
// invalid UTF-8) and stays bounded.
func TestPlaceholderIsALabel(t *testing.T) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "t"}, []string{"v"})
	for _, v := range []string{"ok", "\xff\xfe\xfd", strings.Repeat("\xff", 1<<20), "a\x00b", strings.Repeat("x", 10*MaxBytes), "\u0085\u2028"} {
		p := Placeholder(v, 0)
		if !Valid(p, 4*quotedPrefixBytes+40) {
			t.Errorf("Placeholder(%.40q) = %q, itself invalid: %v", v, p, Check(p, 4*quotedPrefixBytes+40))
		}
		if Valid(v, 0) != (p == v) {
			t.Errorf("Placeholder(%.40q) = %.40q: a valid value is kept, an invalid one replaced", v, p)
		}
		c.WithLabelValues(p).Inc()
	}
	if got, want := Placeholder("\xff\xfe\xfd", 0), `invalid(3 bytes):"\xff\xfe\xfd"`; got != want {
		t.Errorf("Placeholder = %s, want %s", got, want)
	}
}

func BenchmarkCheck(b *testing.B) {
	v := "meta-llama/Llama-3.1-8B-Instruct"
	b.ReportAllocs()
	for b.Loop() {
		if Check(v, 0) != nil {
			b.Fatal("invalid")
		}
	}
}
