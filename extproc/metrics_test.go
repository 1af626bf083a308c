// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

func TestErrorCodeSpelledAsUpstream(t *testing.T) {
	cases := map[int]string{400: "BadRequest", 413: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
		429: "ResourceExhausted", 500: "Internal", 503: "ServiceUnavailable", 418: "418"}
	for status, want := range cases {
		if got := errorCode(status); got != want {
			t.Errorf("errorCode(%d) = %q, want %q", status, got, want)
		}
	}
}

func TestModelLabelCap(t *testing.T) {
	pol := &datastore.Policy{Rewrites: map[string][]datastore.RewriteTarget{
		"alias": {{Model: "target-a"}, {Model: "target-b"}},
		"bad":   {{Model: strings.Repeat("t", labelvalue.MaxBytes+1)}},
	}}
	for _, tc := range []struct {
		name   string
		pol    *datastore.Policy
		models []string
		want   string
	}{
		{"first come", nil, []string{"a", "b", "a", "c", "d", "e", "b", ""}, "a b a c other other b "},
		{"rewrites are reserved", pol, []string{"a", "b", "c", "alias", "target-b", "d", "target-a", "a"}, "a b c alias target-b other target-a a"},
		{"reserved only for the pool that declares them", nil, []string{"a", "b", "c", "alias", "target-a"}, "a b c other other"},
		{"reserved names take no slot", pol, []string{"alias", "target-a", "target-b", "a", "b", "c", "d"}, "alias target-a target-b a b c other"},
		{"invalid values are other", pol, []string{"\xff", "a\x00", strings.Repeat("t", labelvalue.MaxBytes+1), "a"}, "other other other a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &labelCap{max: 3, seen: map[string]struct{}{}}
			var got []string
			for _, m := range tc.models {
				got = append(got, c.value(m, tc.pol))
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("got %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}
