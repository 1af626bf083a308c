// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package filter holds the built-in filters: the gateway's subset hint and
// the conformance suite's endpoint selection.
package filter

import (
	"context"
	"encoding/json"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Type names of the filters.
const (
	SubsetType          = "subset-filter"
	ConformanceTestType = "header-based-testing-filter"
)

// subsetFilter keeps the endpoints listed in the gateway's subset hint
// (Request.Subset); with no hint it keeps all. site-src/protocols.md
// ("Gateway to picker: metadata"): when the hint is present, pick only
// from it.
type subsetFilter struct {
	name framework.TypedName
	key  framework.StateKey
}

// NewSubset is the factory of subset-filter, which takes no parameters.
func NewSubset(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &subsetFilter{name: framework.TypedName{Type: SubsetType, Name: name}, key: framework.StateKey(SubsetType + "/" + name)}, nil
}

func (f *subsetFilter) TypedName() framework.TypedName { return f.name }

// smallSubset is the hint length up to which a linear scan beats a set.
const smallSubset = 8

// outsideSubset is the subset filter's reason for what it drops; made
// once, so a filtered request costs no allocation.
var outsideSubset = framework.NewStatus(framework.Unschedulable, "not in the gateway's subset hint (x-gateway-destination-endpoint-subset)")

func (f *subsetFilter) Filter(_ context.Context, cs *framework.CycleState, req *framework.Request, c []framework.Candidate) ([]framework.Candidate, *framework.Status) {
	if req.Subset == nil {
		return c, nil
	}
	if len(req.Subset) <= smallSubset {
		return dropped(c, filterInPlace(c, func(x *framework.Candidate) bool { return containsString(req.Subset, x.Endpoint.Address()) }), outsideSubset)
	}
	set, _ := cs.Reuse(f.key).(map[string]struct{})
	if set == nil {
		set = make(map[string]struct{}, len(req.Subset))
	}
	clear(set)
	cs.Write(f.key, set)
	for _, a := range req.Subset {
		set[a] = struct{}{}
	}
	out := filterInPlace(c, func(x *framework.Candidate) bool { _, ok := set[x.Endpoint.Address()]; return ok })
	clear(set) // the request's strings must not outlive it
	return dropped(c, out, outsideSubset)
}

// dropped is kept with why when the filter dropped candidates of in, with
// no status when it kept them all.
func dropped(in, kept []framework.Candidate, why *framework.Status) ([]framework.Candidate, *framework.Status) {
	if len(kept) == len(in) {
		return kept, nil
	}
	return kept, why
}

func filterInPlace(c []framework.Candidate, keep func(*framework.Candidate) bool) []framework.Candidate {
	k := 0
	for i := range c {
		if keep(&c[i]) {
			c[k] = c[i]
			k++
		}
	}
	return c[:k]
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
