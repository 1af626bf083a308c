// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"slices"
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
			c := newLabelCap(3, -1, nil)
			var got []string
			for _, m := range tc.models {
				got = append(got, c.value("ns", m, tc.pol).value)
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("got %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

// TestModelLabelBorrowing: the label budget is shared fairly between
// namespaces; a namespace borrows names others leave idle, and a namespace
// within its guaranteed share takes back the most recent name of the one
// that borrows most when the budget is spent.
func TestModelLabelBorrowing(t *testing.T) {
	type use struct {
		ns, name, want string
		takenBack      string // "ns/name" taken back for this use, if any
	}
	names := func(ns, prefix string, n int, want func(i int) string) []use {
		var us []use
		for i := range n {
			us = append(us, use{ns: ns, name: fmt.Sprintf("%s%d", prefix, i), want: want(i)})
		}
		return us
	}
	same := func(prefix string) func(int) string {
		return func(i int) string { return fmt.Sprintf("%s%d", prefix, i) }
	}
	for _, tc := range []struct {
		name     string
		capacity int
		reserve  int
		uses     []use
	}{
		{"a lone namespace borrows all but the reserve", 10, 10,
			names("a", "m", 10, func(i int) string {
				if i < 9 {
					return fmt.Sprintf("m%d", i)
				}
				return otherLabel
			})},
		{"a newcomer gets the reserve, then takes back the borrower's latest names", 10, 10, append(names("a", "m", 9, same("m")),
			use{ns: "b", name: "x", want: "x"},
			use{ns: "b", name: "y", want: "y", takenBack: "a/m8"},
			use{ns: "b", name: "z", want: "z", takenBack: "a/m7"},
			// a's name taken back is other now: a still borrows.
			use{ns: "a", name: "m8", want: otherLabel},
			use{ns: "a", name: "m0", want: "m0"})},
		{"a namespace past its guarantee takes nothing back", 10, -1, append(names("a", "m", 5, same("m")),
			append(names("b", "n", 5, same("n")),
				use{ns: "b", name: "n5", want: otherLabel},
				use{ns: "a", name: "m5", want: otherLabel})...)},
		{"the largest borrower gives back first", 12, -1, append(append(names("a", "m", 7, same("m")), names("b", "n", 5, same("n"))...),
			// a and b each guaranteed 6 of 12; c's arrival makes it 4: a
			// borrows 3, b 1.
			use{ns: "c", name: "x", want: "x", takenBack: "a/m6"},
			use{ns: "c", name: "y", want: "y", takenBack: "a/m5"},
			use{ns: "c", name: "z", want: "z", takenBack: "a/m4"},
			use{ns: "c", name: "w", want: "w", takenBack: "b/n4"},
			use{ns: "c", name: "v", want: otherLabel})},
		{"a namespace at its guarantee takes nothing back", 6, -1, append(names("a", "m", 4, same("m")),
			// Three namespaces, 2 names each guaranteed; a borrows 2.
			use{ns: "b", name: "x", want: "x"},
			use{ns: "c", name: "q", want: "q"},
			use{ns: "b", name: "y", want: "y", takenBack: "a/m3"},
			// b holds its guarantee; a still borrows 1, which c is owed.
			use{ns: "b", name: "z", want: otherLabel},
			use{ns: "c", name: "r", want: "r", takenBack: "a/m2"})},
		{"a name used again keeps its label", 4, -1, []use{
			{ns: "a", name: "m", want: "m"}, {ns: "a", name: "m", want: "m"}, {ns: "b", name: "m", want: "m"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var taken []string
			c := newLabelCap(tc.capacity, tc.reserve, func(ns, name string) { taken = append(taken, ns+"/"+name) })
			admitted := map[string]label{}
			for i, u := range tc.uses {
				taken = nil
				got := c.value(u.ns, u.name, nil)
				if got.value != u.want {
					t.Fatalf("use %d (%s/%s): label %q, want %q", i, u.ns, u.name, got.value, u.want)
				}
				if want := []string{u.takenBack}; u.takenBack == "" && len(taken) > 0 || u.takenBack != "" && !slices.Equal(taken, want) {
					t.Fatalf("use %d (%s/%s): taken back %v, want %q", i, u.ns, u.name, taken, u.takenBack)
				}
				if u.takenBack != "" {
					if l, ok := admitted[u.takenBack]; !ok || c.current(strings.Split(u.takenBack, "/")[0], l) {
						t.Fatalf("use %d: the label of %s taken back is still current", i, u.takenBack)
					}
				}
				if got.value != otherLabel {
					admitted[u.ns+"/"+u.name] = got
					if !c.current(u.ns, got) {
						t.Fatalf("use %d (%s/%s): its label is not current", i, u.ns, u.name)
					}
				}
			}
			total := 0
			for _, n := range c.seen {
				total += len(n.admitted)
			}
			if total > tc.capacity || int64(total) != c.limit.Total() {
				t.Errorf("%d names admitted, %d charged, of a capacity of %d", total, c.limit.Total(), tc.capacity)
			}
		})
	}
}

// TestModelLabelBudgetSharedOverGRPC: one tenant's requests naming more
// models than the label budget borrow what the other leaves idle; when
// the other tenant names its own models, it takes borrowed names back:
// their series are deleted and the first tenant's later requests for them
// count as "other". Each namespace's count, share and names taken back
// are exported.
func TestModelLabelBudgetSharedOverGRPC(t *testing.T) {
	f := newPools(t, 2, 1)
	// 10 names, one kept in reserve: pool 0's namespace alone may use 9.
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxModelLabels: 10, FairShareReservePercent: 10})
	for i := range 10 {
		if _, err := route(ts, t, 0, fmt.Sprintf("tenant-a-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	requests := func(model string, p int) float64 {
		return testutil.ToFloat64(ts.srv.metrics.requests.WithLabelValues(model, model, "0", poolNS(p), poolName(p)))
	}
	if got := requests(otherLabel, 0); got != 1 {
		t.Errorf("pool 0's requests labelled other: %v, want the 1 past the 9 it may borrow", got)
	}
	// The reserve, then a name taken back from tenant a.
	for _, m := range []string{"tenant-b-0", "tenant-b-1"} {
		if _, err := route(ts, t, 1, m); err != nil {
			t.Fatal(err)
		}
		if got := requests(m, 1); got != 1 {
			t.Errorf("pool 1's request for %s counted %v times under its own label, want 1", m, got)
		}
	}
	_, text := seriesOf(t, ts)
	if strings.Contains(text, `model_name="tenant-a-8"`) {
		t.Errorf("a series of tenant a's name taken back is left:\n%s", text)
	}
	if _, err := route(ts, t, 0, "tenant-a-8"); err != nil {
		t.Fatal(err)
	}
	if got := requests(otherLabel, 0); got != 2 {
		t.Errorf("pool 0's requests labelled other: %v, want 2 (its name taken back counts as other)", got)
	}
	want := fmt.Sprintf(`
# HELP poolpicker_model_labels Distinct model names a namespace's requests use as metric label values now, of the --max-model-labels all namespaces share (names its pools' InferenceModelRewrites mention are not counted).
# TYPE poolpicker_model_labels gauge
poolpicker_model_labels{namespace=%[1]q} 8
poolpicker_model_labels{namespace=%[2]q} 2
# HELP poolpicker_model_labels_reclaimed_total Model names a namespace had borrowed beyond its share of --max-model-labels, taken back for a namespace within its share: their series were deleted and the namespace's later requests naming them count as "other".
# TYPE poolpicker_model_labels_reclaimed_total counter
poolpicker_model_labels_reclaimed_total{namespace=%[1]q} 1
`, poolNS(0), poolNS(1))
	if err := testutil.CollectAndCompare(ts.srv.metrics.models, strings.NewReader(want), "poolpicker_model_labels", "poolpicker_model_labels_reclaimed_total"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(ts.srv.metrics.models, strings.NewReader(fmt.Sprintf(`
# HELP poolpicker_fair_share_used What a pool holds now of a fairly shared limit (namespace and pool empty: streams whose pool is not known yet).
# TYPE poolpicker_fair_share_used gauge
poolpicker_fair_share_used{limit="model_labels",namespace=%[1]q,pool=""} 8
poolpicker_fair_share_used{limit="model_labels",namespace=%[2]q,pool=""} 2
`, poolNS(0), poolNS(1))), "poolpicker_fair_share_used"); err != nil {
		t.Error(err)
	}
}
