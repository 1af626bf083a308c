// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package filter

import (
	"context"
	"encoding/json"
	"net"
	"strings"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// conformanceTestFilter keeps the endpoints whose pod IP the conformance
// suite named (Request.CandidateIPs, from header test-epp-endpoint-selection);
// with none named it keeps all. Only in profiles when
// the scheduler's Options.EnableConformanceTestFilter is set.
type conformanceTestFilter struct{ name framework.TypedName }

// NewConformanceTest is the factory of header-based-testing-filter, which
// takes no parameters.
func NewConformanceTest(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &conformanceTestFilter{name: framework.TypedName{Type: ConformanceTestType, Name: name}}, nil
}

func (f *conformanceTestFilter) TypedName() framework.TypedName { return f.name }

// notSelected is the conformance filter's reason for what it drops.
var notSelected = framework.NewStatus(framework.Unschedulable, "not selected by the test-epp-endpoint-selection header")

func (f *conformanceTestFilter) Filter(_ context.Context, _ *framework.CycleState, req *framework.Request, c []framework.Candidate) ([]framework.Candidate, *framework.Status) {
	if req.CandidateIPs == nil {
		return c, nil
	}
	return dropped(c, filterInPlace(c, func(x *framework.Candidate) bool {
		return conformanceSelects(req.CandidateIPs, x.Endpoint.IP(), x.Endpoint.Address())
	}), notSelected)
}

// conformanceSelects reports whether one of the suite's tokens names the
// endpoint: a bare IP names every port of the pod, an ip:port (the
// data-parallel test's form, [v6]:port for IPv6) names one endpoint.
func conformanceSelects(tokens []string, ip, address string) bool {
	for _, tok := range tokens {
		if host, port, err := net.SplitHostPort(tok); err == nil {
			if host == ip && net.JoinHostPort(host, port) == address {
				return true
			}
			continue
		}
		if strings.Trim(tok, "[]") == ip {
			return true
		}
	}
	return false
}
