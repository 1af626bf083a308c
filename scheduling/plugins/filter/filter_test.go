// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package filter

import (
	"fmt"
	"testing"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

func TestFilters(t *testing.T) {
	var eps []*frameworktest.Endpoint
	for i := 1; i <= 4; i++ {
		eps = append(eps, frameworktest.NewEndpoint(fmt.Sprintf("127.0.1.%d:8000", i), nil))
	}
	pool := frameworktest.NewPool("ns", "pool", eps...)
	addr := func(i int) string { return eps[i-1].Address() }
	ip := func(i int) string { return eps[i-1].IP() }
	var many []string
	for i := 0; i < 20; i++ {
		many = append(many, "10.0.0.1:"+string(rune('a'+i)))
	}
	many = append(many, addr(4), addr(2))
	cases := []struct {
		name    string
		factory framework.Factory
		req     framework.Request
		want    []int // pods kept, in pool order
	}{
		{"subset absent keeps all", NewSubset, framework.Request{}, []int{1, 2, 3, 4}},
		{"subset small", NewSubset, framework.Request{Subset: []string{addr(3), addr(1), "1.2.3.4:80"}}, []int{1, 3}},
		{"subset large", NewSubset, framework.Request{Subset: many}, []int{2, 4}},
		{"subset empty keeps none", NewSubset, framework.Request{Subset: []string{}}, nil},
		{"subset matches address, not IP", NewSubset, framework.Request{Subset: []string{ip(1)}}, nil},
		{"conformance absent keeps all", NewConformanceTest, framework.Request{}, []int{1, 2, 3, 4}},
		{"conformance by IP", NewConformanceTest, framework.Request{CandidateIPs: []string{ip(2), ip(4)}}, []int{2, 4}},
		{"conformance unknown IP", NewConformanceTest, framework.Request{CandidateIPs: []string{"10.1.1.1"}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cs := frameworktest.NewCycle(pool, "", 1)
			f := frameworktest.Build(t, c.factory, "test", "").(framework.Filter)
			got, st := frameworktest.Filter(t, f, cs, &c.req, frameworktest.Candidates(cs))
			// A filter that dropped candidates says why; one that kept
			// them all says nothing.
			if dropped := len(got) < 4; dropped != (st.Code() == framework.Unschedulable) || dropped != (st.Message() != "") {
				t.Fatalf("kept %d of 4 with status %v", len(got), st)
			}
			// Pool order is by address; compare as sets of addresses.
			if len(got) != len(c.want) {
				t.Fatalf("kept %d, want %d", len(got), len(c.want))
			}
			for _, i := range c.want {
				found := false
				for _, g := range got {
					found = found || g.Endpoint.Address() == addr(i)
				}
				if !found {
					t.Fatalf("pod %d filtered out", i)
				}
			}
		})
	}
}
