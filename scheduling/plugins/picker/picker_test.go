// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package picker

import (
	"fmt"
	"math"
	"testing"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

func TestPickers(t *testing.T) {
	var eps []*frameworktest.Endpoint
	for i := 1; i <= 5; i++ {
		eps = append(eps, frameworktest.NewEndpoint(fmt.Sprintf("127.0.1.%d:8000", i), nil))
	}
	pool := frameworktest.NewPool("ns", "pool", eps...)
	const draws = 20000
	cases := []struct {
		name    string
		factory framework.Factory
		scores  []float64
		n       int
		// check gets how often each index came first, and one pick.
		check func(t *testing.T, first []int, one []int)
	}{
		{"max-score orders by score", NewMaxScore, []float64{1, 5, 3, 4, 2}, 3, func(t *testing.T, first, one []int) {
			if one[0] != 1 || one[1] != 3 || one[2] != 2 || first[1] != draws {
				t.Fatalf("picked %v, first counts %v", one, first)
			}
		}},
		{"max-score breaks ties uniformly", NewMaxScore, []float64{2, 2, 1, 2, 2.0000000000001}, 2, func(t *testing.T, first, one []int) {
			if one[0] == one[1] || first[2] != 0 {
				t.Fatalf("picked %v, first counts %v", one, first)
			}
			for _, i := range []int{0, 1, 3, 4} {
				within(t, first[i], draws, 0.25)
			}
		}},
		{"random is uniform", NewRandom, []float64{9, 0, 0, 0, 0}, 3, func(t *testing.T, first, one []int) {
			if one[0] == one[1] || one[1] == one[2] || one[0] == one[2] {
				t.Fatalf("repeated endpoint: %v", one)
			}
			for i := range first {
				within(t, first[i], draws, 0.2)
			}
		}},
		{"weighted-random follows scores", NewWeightedRandom, []float64{1, 0, 3, 0, 4}, 5, func(t *testing.T, first, one []int) {
			within(t, first[0], draws, 1.0/8)
			within(t, first[2], draws, 3.0/8)
			within(t, first[4], draws, 4.0/8)
			if first[1]+first[3] != 0 || len(one) != 5 {
				t.Fatalf("zero-score endpoints first %d times; picked %v", first[1]+first[3], one)
			}
			if one[3] != 1 && one[3] != 3 || one[4] != 1 && one[4] != 3 {
				t.Fatalf("zero-score endpoints must come last: %v", one)
			}
		}},
		{"round-robin takes turns", NewRoundRobin, []float64{9, 0, 0, 0, 0}, 2, func(t *testing.T, first, one []int) {
			if one[1] != (one[0]+1)%5 {
				t.Fatalf("picked %v, want consecutive endpoints", one)
			}
			for i := range first {
				if first[i] != draws/5 {
					t.Fatalf("first counts %v, want %d each", first, draws/5)
				}
			}
		}},
		{"weighted-random with all zero is uniform", NewWeightedRandom, []float64{0, 0, 0, 0, 0}, 1, func(t *testing.T, first, one []int) {
			for i := range first {
				within(t, first[i], draws, 0.2)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := frameworktest.Build(t, c.factory, "test", "").(framework.Picker)
			cs := frameworktest.NewCycle(pool, "", 7)
			cands := frameworktest.Candidates(cs)
			first := make([]int, len(cands))
			var one []int
			for i := 0; i < draws; i++ {
				one = frameworktest.Pick(t, p, cs, &framework.Request{}, cands, c.scores, c.n)
				if len(one) != c.n {
					t.Fatalf("picked %d, want %d", len(one), c.n)
				}
				first[one[0]]++
			}
			c.check(t, first, one)
		})
	}
}

// within fails unless count/draws is within 5 binomial standard deviations of p.
func within(t *testing.T, count, draws int, p float64) {
	t.Helper()
	sd := math.Sqrt(float64(draws) * p * (1 - p))
	if math.Abs(float64(count)-float64(draws)*p) > 5*sd {
		t.Fatalf("%d of %d, want %.0f ± %.0f", count, draws, float64(draws)*p, 5*sd)
	}
}
