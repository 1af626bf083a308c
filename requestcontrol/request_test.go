// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
)

// pool is a served, synced pool of n pods in a fresh registry whose load
// observers are observers.
func pool(t *testing.T, n int, observers ...datastore.LoadObserver) *datastore.Pool {
	t.Helper()
	reg := datastore.NewRegistry()
	for _, o := range observers {
		reg.AddLoadObserver(o)
	}
	p := reg.Upsert(types.NamespacedName{Namespace: "ns", Name: "pool"}, &datastore.PoolSpec{
		Selector: map[string]string{"app": "pool"}, TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9002,
	})
	var srcs []datastore.EndpointSource
	for i := range n {
		srcs = append(srcs, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)},
			UID: types.UID(fmt.Sprintf("uid-%d", i)), IP: fmt.Sprintf("127.0.0.%d", i+2)})
	}
	p.SetPods(srcs)
	p.SetSynced(true)
	return p
}

// counts records every in-flight change the ledger reports.
type counts map[string]int64

func (c counts) InFlightChanged(_ *datastore.Pool, e *datastore.Endpoint) {
	c[e.Address] = e.InFlight()
}

// noWait is the Waiter of a request that never waits (no flow control).
type noWait struct{}

func (noWait) Waiting() {}
func (noWait) Resumed() {}

func controller(t *testing.T, o Options) *Controller {
	t.Helper()
	s, err := scheduling.New(nil, scheduling.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(s, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRequestLife: a picked request is counted on its endpoint from
// Commit, moved by Served to the endpoint that served it, and uncounted by
// the first Finish alone; the observer hears each change.
func TestRequestLife(t *testing.T) {
	for _, tc := range []struct {
		name   string
		served string // "" none; "other" another endpoint of the pool; else that address
	}{
		{name: "served where picked"},
		{name: "served by a fallback", served: "other"},
		{name: "served by an address not in the pool", served: "127.9.9.9:8000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := counts{}
			p := pool(t, 2, seen)
			c := controller(t, Options{})
			r := c.Request()
			r.Pool, r.ID, r.ModelRewrite = p, "req-1", "rewritten"
			r.SetBody("asked", []byte("a prompt"))
			if r.Model() != "rewritten" {
				t.Fatalf("Model() = %q, want the header's rewrite", r.Model())
			}
			d, err := r.Pick(context.Background(), noWait{})
			if err != nil {
				t.Fatalf("Pick: %v", err)
			}
			if !d.Scheduled || d.Result == nil || d.Target != "rewritten" {
				t.Fatalf("decision %+v, want a result for model rewritten", d)
			}
			if p.LastRequest().IsZero() {
				t.Fatal("the pool's demand was not noted")
			}
			r.Commit()
			r.Sent()
			picked := d.Result.Endpoints[0]
			if picked.InFlight() != 1 || seen[picked.Address] != 1 || r.Endpoint() != picked {
				t.Fatalf("after Commit: %d in flight on %s (observer %v), want 1", picked.InFlight(), picked.Address, seen)
			}
			want := picked
			switch tc.served {
			case "":
			case "other":
				for _, e := range p.Endpoints().Endpoints {
					if e != picked {
						want = e
					}
				}
				r.Served(want.Address)
			default:
				r.Served(tc.served)
			}
			for range 2 {
				r.Finish()
			}
			for _, e := range p.Endpoints().Endpoints {
				if e.InFlight() != 0 || seen[e.Address] != 0 {
					t.Fatalf("after Finish: %s has %d in flight (observer %v), want 0", e.Address, e.InFlight(), seen)
				}
			}
			if r.Endpoint() != want || !r.Finished() {
				t.Fatalf("counted on %v, finished %v; want %s, true", r.Endpoint(), r.Finished(), want.Address)
			}
			r.Served(picked.Address) // after Finish: nothing moves
			if picked.InFlight() != 0 {
				t.Fatalf("Served after Finish counted %d on %s", picked.InFlight(), picked.Address)
			}
		})
	}
}

// TestPickRefusal: a pool without endpoints is refused with the
// scheduler's 503, as a *Refusal, and nothing is counted.
func TestPickRefusal(t *testing.T) {
	p := pool(t, 0)
	r := controller(t, Options{}).Request()
	r.Pool, r.ID = p, "req-1"
	d, err := r.Pick(context.Background(), noWait{})
	var rf *Refusal
	if !errors.As(err, &rf) || rf.Code != http.StatusServiceUnavailable {
		t.Fatalf("Pick: %v, want a 503 Refusal", err)
	}
	if !d.Scheduled || d.Result != nil {
		t.Fatalf("decision %+v, want scheduled without a result", d)
	}
	r.Sent()
	r.Finish()
	if r.Endpoint() != nil {
		t.Fatalf("a refused request is counted on %s", r.Endpoint().Address)
	}
}
