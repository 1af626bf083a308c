// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
			c := newLabelCap(3)
			var got []string
			for _, m := range tc.models {
				got = append(got, c.value("ns", m, tc.pol))
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("got %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

// TestModelLabelBudgetPerNamespace: one tenant's requests naming more
// models than the label budget turn only its own later names into
// "other"; another namespace's pool keeps its names, and each namespace's
// count is exported.
func TestModelLabelBudgetPerNamespace(t *testing.T) {
	f := newPools(t, 2, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxModelLabels: 4})
	for i := 0; i < 6; i++ {
		if _, err := route(ts, t, 0, fmt.Sprintf("tenant-a-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := route(ts, t, 1, "tenant-b"); err != nil {
		t.Fatal(err)
	}
	requests := func(model string, p int) float64 {
		return testutil.ToFloat64(ts.srv.metrics.requests.WithLabelValues(model, model, "0", poolNS(p), poolName(p)))
	}
	if got := requests(otherLabel, 0); got != 2 {
		t.Errorf("pool 0's requests labelled other: %v, want the 2 past its namespace's budget of 4", got)
	}
	if got := requests("tenant-b", 1); got != 1 {
		t.Errorf("pool 1's request labelled by its model: %v, want 1 (another namespace's names must not spend its budget)", got)
	}
	want := fmt.Sprintf(`
# HELP poolpicker_model_labels Distinct model names a namespace's requests use as metric label values now, of the --max-model-labels each namespace may use (names its pools' InferenceModelRewrites mention are not counted).
# TYPE poolpicker_model_labels gauge
poolpicker_model_labels{namespace=%q} 4
poolpicker_model_labels{namespace=%q} 1
`, poolNS(0), poolNS(1))
	if err := testutil.CollectAndCompare(ts.srv.metrics.models, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
