// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
)

// TestFirstOf: the endpoint flow control gave a request goes first, the
// scheduler's other picks after it in their order, as many as it picked.
func TestFirstOf(t *testing.T) {
	ep := func(n string) *datastore.Endpoint {
		return &datastore.Endpoint{PodUID: types.UID(n), Port: 8000, Address: n + ":8000"}
	}
	a, b, c, d := ep("a"), ep("b"), ep("c"), ep("d")
	for _, tc := range []struct {
		name string
		eps  []*datastore.Endpoint
		to   *datastore.Endpoint
		want string
	}{
		{"a fallback goes first", []*datastore.Endpoint{a, b, c}, c, "c a b"},
		{"an endpoint not picked goes first, the last drops", []*datastore.Endpoint{a, b, c}, d, "d a b"},
		{"one pick", []*datastore.Endpoint{a}, d, "d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range firstOf(tc.eps, tc.to) {
				got = append(got, string(e.PodUID))
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Fatalf("got %s, want %s", s, tc.want)
			}
		})
	}
}
