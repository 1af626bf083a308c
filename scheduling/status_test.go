// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// statusPlugin is a filter or a scorer (by its type) that answers with a
// status: the filter keeps the endpoints at its addresses, the scorer
// scores them 1; both return code with reason (Success: nil).
type statusPlugin struct {
	name   TypedName
	keep   []string
	code   framework.Code
	reason string
}

type statusFilter struct{ statusPlugin }
type statusScorer struct{ statusPlugin }

func (p *statusPlugin) TypedName() TypedName { return p.name }

func (p *statusPlugin) status() *framework.Status {
	if p.code == framework.Success {
		return nil
	}
	return framework.NewStatus(p.code, p.reason)
}

func (p *statusFilter) Filter(_ context.Context, _ *framework.CycleState, _ *Request, c []framework.Candidate) ([]framework.Candidate, *framework.Status) {
	return slices.DeleteFunc(c, func(x framework.Candidate) bool { return !slices.Contains(p.keep, x.Endpoint.Address()) }), p.status()
}

func (p *statusScorer) Score(_ context.Context, _ *framework.CycleState, _ *Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		if slices.Contains(p.keep, c[i].Endpoint.Address()) {
			scores[i] = 1
		}
	}
	return p.status()
}

// statusRegistry has the built-in plugins and status-filter and
// status-scorer, whose parameters are a statusPlugin's.
func statusRegistry(t *testing.T) *framework.Registry {
	t.Helper()
	r := NewRegistry()
	factory := func(typ string) framework.Factory {
		return func(name string, raw json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
			var p struct {
				Keep   []string `json:"keep"`
				Code   int      `json:"code"`
				Reason string   `json:"reason"`
			}
			if err := framework.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			sp := statusPlugin{name: TypedName{Type: typ, Name: name}, keep: p.Keep, code: framework.Code(p.Code), reason: p.Reason}
			if typ == "status-filter" {
				return &statusFilter{sp}, nil
			}
			return &statusScorer{sp}, nil
		}
	}
	for _, typ := range []string{"status-filter", "status-scorer"} {
		if err := r.Register(typ, factory(typ)); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestPluginStatuses: what filters and scorers say of a request reaches the
// result, the recorded decision and a refusal's message; a scorer that
// could not score ranks no one; a filter that failed refuses the request.
func TestPluginStatuses(t *testing.T) {
	tp := newTestPool(t, 4, nil)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0.1) })
	a := []string{tp.Ep(t, 1).Address, tp.Ep(t, 2).Address, tp.Ep(t, 3).Address, tp.Ep(t, 4).Address}
	subset := PluginStatus{Plugin: SubsetFilterType, ExtensionPoint: FilterExtensionPoint, Code: "Unschedulable",
		Reasons: []string{"not in the gateway's subset hint (x-gateway-destination-endpoint-subset)"}, Dropped: 2}
	cases := []struct {
		name    string
		plugins string // the config's plugins besides the subset filter
		subset  []string
		want    []PluginStatus
		primary string
		// err is a part of the refusal's message; "" when the pick succeeds.
		err string
	}{{
		name:    "every plugin succeeds",
		plugins: "- type: status-scorer\n  parameters: {keep: [\"" + a[2] + "\"]}\n",
		primary: a[2],
	}, {
		name:    "a filter says why it dropped candidates",
		plugins: "- type: status-scorer\n  parameters: {keep: [\"" + a[1] + "\"]}\n",
		subset:  []string{a[0], a[1]},
		want:    []PluginStatus{subset},
		primary: a[1],
	}, {
		name: "a scorer that could not score ranks no one",
		plugins: "- type: status-scorer\n  name: broken\n  parameters: {keep: [\"" + a[0] + "\"], code: 2, reason: tokenizer unreachable}\n" +
			"- type: status-scorer\n  name: pin\n  parameters: {keep: [\"" + a[3] + "\"]}\n",
		want:    []PluginStatus{{Plugin: "broken/status-scorer", ExtensionPoint: ScorerExtensionPoint, Code: "Failed", Reasons: []string{"tokenizer unreachable"}}},
		primary: a[3],
	}, {
		name:    "a filter that failed refuses the request",
		plugins: "- type: status-filter\n  parameters: {keep: [\"" + a[0] + "\"], code: 2, reason: label index not ready}\n",
		want:    []PluginStatus{{Plugin: "status-filter", ExtensionPoint: FilterExtensionPoint, Code: "Failed", Reasons: []string{"label index not ready"}, Dropped: 3}},
		err:     `filter "status-filter" failed: label index not ready`,
	}, {
		name:    "a filter that left no endpoint says why",
		plugins: "- type: status-scorer\n",
		subset:  []string{"10.9.9.9:8000"},
		want:    []PluginStatus{{Plugin: SubsetFilterType, ExtensionPoint: FilterExtensionPoint, Code: "Unschedulable", Reasons: subset.Reasons, Dropped: 4}},
		err:     `filter "subset-filter" left no endpoint (of 4) for the request: not in the gateway's subset hint`,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := header + "plugins:\n- type: subset-filter\n" + c.plugins
			s, err := New(nil, Options{Registry: statusRegistry(t), ConfigText: cfg, Rand: schedtest.SeededRand(1)})
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Schedule(ctx, tp.Pool, &Request{ID: "r", Model: "m", Subset: c.subset})
			decisions := s.RecentDecisions(tp.Pool)
			if len(decisions) != 1 {
				t.Fatalf("%d decisions recorded, want 1", len(decisions))
			}
			d := decisions[0]
			if c.err != "" {
				if !errors.Is(err, ErrNoEndpoints) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want a 503 containing %q", err, c.err)
				}
				if !strings.Contains(d.Error, c.err) || len(d.Picked) != 0 {
					t.Fatalf("decision of the refusal: error %q, picked %v", d.Error, d.Picked)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if got := res.Endpoints[0].Address; got != c.primary {
					t.Fatalf("primary %s, want %s", got, c.primary)
				}
				if !slices.EqualFunc(res.Statuses, c.want, equalStatus) {
					t.Fatalf("result statuses %v, want %v", res.Statuses, c.want)
				}
			}
			if !slices.EqualFunc(d.Statuses, c.want, equalStatus) {
				t.Fatalf("decision statuses %v, want %v", d.Statuses, c.want)
			}
			for _, sc := range d.Candidates {
				for i, name := range d.Scorers {
					if name == "broken/status-scorer" && sc.Scores[i] != 0 {
						t.Fatalf("the failed scorer's score of %s recorded as %v, want 0", sc.Address, sc.Scores[i])
					}
				}
			}
		})
	}
}

func equalStatus(a, b PluginStatus) bool {
	return a.Plugin == b.Plugin && a.ExtensionPoint == b.ExtensionPoint && a.Code == b.Code && a.Dropped == b.Dropped && slices.Equal(a.Reasons, b.Reasons)
}
