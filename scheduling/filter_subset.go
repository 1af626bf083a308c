package scheduling

import (
	"context"
	"encoding/json"
)

// subsetFilter keeps the endpoints listed in the gateway's subset hint
// (Request.Subset); with no hint it keeps all. site-src/protocols.md ("Gateway to picker: metadata"): when the hint
// is present, pick only from it.
type subsetFilter struct {
	name TypedName
	key  StateKey
}

func newSubsetFilter(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &subsetFilter{name: TypedName{Type: SubsetFilterType, Name: name}, key: StateKey(SubsetFilterType + "/" + name)}, nil
}

func (f *subsetFilter) TypedName() TypedName { return f.name }

// smallSubset is the hint length up to which a linear scan beats a set.
const smallSubset = 8

func (f *subsetFilter) Filter(_ context.Context, cs *CycleState, req *Request, c []Candidate) []Candidate {
	if req.Subset == nil {
		return c
	}
	if len(req.Subset) <= smallSubset {
		return filterInPlace(c, func(x *Candidate) bool { return containsString(req.Subset, x.Endpoint.Address) })
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
	out := filterInPlace(c, func(x *Candidate) bool { _, ok := set[x.Endpoint.Address]; return ok })
	clear(set) // the request's strings must not outlive it
	return out
}

func filterInPlace(c []Candidate, keep func(*Candidate) bool) []Candidate {
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
