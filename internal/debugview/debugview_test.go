// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package debugview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/debugview"
	"github.com/poolpicker/poolpicker/scheduling"
)

// TestHandler serves a registry of two pools and a real scheduler over
// loopback HTTP: the filters select pools, each endpoint shows its scrape's
// age, queue and in-flight count, and a pool's picks are listed newest
// first.
func TestHandler(t *testing.T) {
	reg := datastore.NewRegistry()
	sched, err := scheduling.New(nil, scheduling.Options{DecisionsPerPool: 2})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(sched)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, ns := range []string{"team-a", "team-b"} {
		p := reg.Upsert(types.NamespacedName{Namespace: ns, Name: "chat"}, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}, PickerService: "epp", PickerPort: 9002})
		p.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: ns, Name: "server"}, UID: types.UID(ns), IP: "10.0.0.1"}})
		p.SetSynced(true)
		e := p.Endpoints().Endpoints[0]
		e.SetMetrics(&datastore.Metrics{WaitingRequests: 4, RunningRequests: 1, KVCacheUsage: 0.5, ScrapedAt: now.Add(-1500 * time.Millisecond)})
		e.AddInFlight(2)
	}
	a, _ := reg.Get(types.NamespacedName{Namespace: "team-a", Name: "chat"})
	for i := range 3 {
		res, err := sched.ScheduleDeferred(context.Background(), a, &scheduling.Request{ID: fmt.Sprint("r", i), Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		res.Commit()
	}
	srv := httptest.NewServer(debugview.Handler(debugview.Options{Registry: reg, Decisions: sched.RecentDecisions, Now: func() time.Time { return now }}))
	defer srv.Close()

	for _, tc := range []struct {
		query     string
		wantPools []string
	}{
		{"", []string{"team-a/chat", "team-b/chat"}},
		{"?namespace=team-b", []string{"team-b/chat"}},
		{"?pool=chat&namespace=team-a", []string{"team-a/chat"}},
		{"?pool=code", nil},
	} {
		resp, err := http.Get(srv.URL + debugview.Path + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		var v debugview.View
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %v", tc.query, resp.StatusCode, err)
		}
		var got []string
		for _, p := range v.Pools {
			got = append(got, p.Namespace+"/"+p.Name)
			e := p.Endpoints[0]
			if e.Address != "10.0.0.1:8000" || e.InFlight != 2 || e.Metrics == nil || e.Metrics.AgeSeconds != 1.5 || e.Metrics.Waiting != 4 || p.PickerService != "epp:9002" {
				t.Errorf("%s: pool %s endpoint %+v metrics %+v", tc.query, got[len(got)-1], e, e.Metrics)
			}
			wantDecisions := 0
			if p.Namespace == "team-a" {
				wantDecisions = 2
			}
			if len(p.Decisions) != wantDecisions || (wantDecisions > 0 && p.Decisions[0].Request != "r2") {
				t.Errorf("%s: pool %s decisions %+v, want the last %d, newest first", tc.query, got[len(got)-1], p.Decisions, wantDecisions)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.wantPools) {
			t.Errorf("%s: pools %v, want %v", tc.query, got, tc.wantPools)
		}
	}

	resp, err := http.Post(srv.URL+debugview.Path, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}
}
