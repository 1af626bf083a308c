// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package frameworktest_test

import (
	"slices"
	"testing"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
	"github.com/poolpicker/poolpicker/scheduling/plugins/filter"
	"github.com/poolpicker/poolpicker/scheduling/plugins/load"
	"github.com/poolpicker/poolpicker/scheduling/plugins/picker"
)

// observer records what a pool tells its observers.
type observer struct {
	added, removed []string
	poolsRemoved   int
}

func (o *observer) EndpointsChanged(_ framework.Pool, added, removed []framework.Endpoint) {
	for _, e := range added {
		o.added = append(o.added, e.Address())
	}
	for _, e := range removed {
		o.removed = append(o.removed, e.Address())
	}
}

func (o *observer) PoolRemoved(framework.Pool) { o.poolsRemoved++ }

// TestPool: a test pool sorts its endpoints by address, swaps its set as a
// datastore pool does (a new snapshot, observers told of what came and
// went) and tells them of its removal.
func TestPool(t *testing.T) {
	a, b, c := frameworktest.NewEndpoint("127.0.0.2:8000", nil), frameworktest.NewEndpoint("127.0.0.1:8000", map[string]string{"k": "v"}), frameworktest.NewEndpoint("[fd00::1]:9000", nil)
	p := frameworktest.NewPool("ns", "pool", a, b)
	o := &observer{}
	p.Observe(o)
	first := p.Endpoints()
	if first != p.Endpoints() || first.Len() != 2 || first.At(0) != b || first.At(1) != a {
		t.Fatalf("endpoint set not one snapshot sorted by address: %v %v", first.At(0).Address(), first.At(1).Address())
	}
	if got, ok := first.Get("127.0.0.1:8000"); !ok || got != b || got.Labels()["k"] != "v" || got.IP() != "127.0.0.1" || got.Port() != 8000 {
		t.Fatalf("Get: %v %v", got, ok)
	}
	if c.IP() != "fd00::1" || c.Port() != 9000 || c.Key() != (framework.EndpointKey{UID: "uid-fd00::1", Port: 9000}) {
		t.Fatalf("IPv6 endpoint: %s %d %v", c.IP(), c.Port(), c.Key())
	}
	p.SetEndpoints(a, c)
	if p.Endpoints() == first || !slices.Equal(o.added, []string{"[fd00::1]:9000"}) || !slices.Equal(o.removed, []string{"127.0.0.1:8000"}) {
		t.Fatalf("after a swap: same set %v, added %v, removed %v", p.Endpoints() == first, o.added, o.removed)
	}
	p.Remove()
	if !p.Removed() || o.poolsRemoved != 1 {
		t.Fatalf("removed %v, observers told %d times", p.Removed(), o.poolsRemoved)
	}
}

// TestRun runs built-in plugins through a cycle as the scheduler would:
// the subset filter says why it dropped endpoints, the queue scorer ranks
// by the scrapes set, an unscraped endpoint's load is unknown, and the
// picker picks the best.
func TestRun(t *testing.T) {
	eps := []*frameworktest.Endpoint{
		frameworktest.NewEndpoint("127.0.0.1:8000", nil),
		frameworktest.NewEndpoint("127.0.0.2:8000", nil),
		frameworktest.NewEndpoint("127.0.0.3:8000", nil),
		frameworktest.NewEndpoint("127.0.0.4:8000", nil),
	}
	eps[0].SetScrape(frameworktest.Load(4, 0.1))
	eps[1].SetScrape(frameworktest.Load(0, 0.1))
	eps[2].SetScrape(frameworktest.Load(8, 0.1))
	eps[3].SetInFlight(3)
	p := frameworktest.NewPool("ns", "pool", eps...)
	cs := frameworktest.NewCycle(p, "m", 1)
	if cs.TargetModel != "m" || cs.Endpoints != p.Endpoints() || p.Requests() != 1 {
		t.Fatalf("cycle: model %q, over the pool's set %v, requests %d", cs.TargetModel, cs.Endpoints == p.Endpoints(), p.Requests())
	}
	cands := frameworktest.Candidates(cs)
	if len(cands) != 4 || !cands[3].Metrics.IsZero() || cands[2].Index != 2 || cands[3].Endpoint.InFlight() != 3 || !cs.Saturated(&cands[2]) {
		t.Fatalf("candidates %+v", cands)
	}
	req := &framework.Request{Subset: []string{"127.0.0.1:8000", "127.0.0.2:8000", "127.0.0.3:8000"}}
	f := frameworktest.Build(t, filter.NewSubset, "subset", "").(framework.Filter)
	kept, st := frameworktest.Filter(t, f, cs, req, cands)
	if len(kept) != 3 || st.Code() != framework.Unschedulable || st.Message() == "" {
		t.Fatalf("subset filter kept %d with status %v", len(kept), st)
	}
	s := frameworktest.Build(t, load.NewQueue, "queue", "").(framework.Scorer)
	scores, st := frameworktest.Score(t, s, cs, req, kept)
	if st != nil || !slices.Equal(scores, []float64{0.5, 1, 0}) {
		t.Fatalf("queue scores %v, status %v", scores, st)
	}
	pk := frameworktest.Build(t, picker.NewMaxScore, "max", "").(framework.Picker)
	if got := frameworktest.Pick(t, pk, cs, req, kept, scores, 2); !slices.Equal(got, []int{1, 0}) {
		t.Fatalf("picked %v, want [1 0]", got)
	}
}
