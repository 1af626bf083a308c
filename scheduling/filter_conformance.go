package scheduling

import (
	"context"
	"encoding/json"
)

// conformanceTestFilter keeps the endpoints whose pod IP the conformance
// suite named (Request.CandidateIPs, from header test-epp-endpoint-selection);
// with none named it keeps all. Only in profiles when
// Options.EnableConformanceTestFilter is set.
type conformanceTestFilter struct{ name TypedName }

func newConformanceTestFilter(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &conformanceTestFilter{name: TypedName{Type: ConformanceTestFilterType, Name: name}}, nil
}

func (f *conformanceTestFilter) TypedName() TypedName { return f.name }

func (f *conformanceTestFilter) Filter(_ context.Context, _ *CycleState, req *Request, c []Candidate) []Candidate {
	if req.CandidateIPs == nil {
		return c
	}
	return filterInPlace(c, func(x *Candidate) bool { return containsString(req.CandidateIPs, x.Endpoint.IP) })
}
