// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

const twoScorerConfig = `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: max-score-picker
`

// TestRecentDecisions: the scheduler keeps each pool's last decisions,
// newest first, with each scorer's score of every candidate whose weighted
// sum is the total the picker ranked by.
func TestRecentDecisions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keep      int
		endpoints int
		picks     int
		// want: decisions kept, candidates in each.
		wantDecisions, wantCandidates int
	}{
		{name: "fewer picks than slots", keep: 4, endpoints: 3, picks: 2, wantDecisions: 2, wantCandidates: 3},
		{name: "the ring wraps", keep: 3, endpoints: 3, picks: 7, wantDecisions: 3, wantCandidates: 3},
		{name: "a large pool keeps the best candidates", keep: 2, endpoints: 40, picks: 2, wantDecisions: 2, wantCandidates: maxRecordedCandidates},
		{name: "off", keep: -1, endpoints: 3, picks: 2, wantDecisions: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustScheduler(t, twoScorerConfig, Options{DecisionsPerPool: tc.keep})
			tp := newTestPool(t, tc.endpoints, s)
			for i, e := range tp.Pool.Endpoints().Endpoints {
				e.SetMetrics(schedtest.Load(i%5, float64(i%4)/4))
			}
			var picked []string
			for i := range tc.picks {
				res, err := s.Schedule(ctx, tp.Pool, &Request{ID: fmt.Sprint("r", i), Model: "m"})
				if err != nil {
					t.Fatal(err)
				}
				picked = append(picked, res.Endpoints[0].Address)
			}
			got := s.RecentDecisions(tp.Pool)
			if len(got) != tc.wantDecisions {
				t.Fatalf("%d decisions kept, want %d", len(got), tc.wantDecisions)
			}
			for k, d := range got {
				if want := fmt.Sprint("r", tc.picks-1-k); d.Request != want {
					t.Errorf("decision %d is of request %s, want %s (newest first)", k, d.Request, want)
				}
				if d.Picked[0] != picked[tc.picks-1-k] {
					t.Errorf("decision %d picked %v, the pick was %s", k, d.Picked, picked[tc.picks-1-k])
				}
				if !slices.Equal(d.Scorers, []string{"queue-scorer", "kv-cache-utilization-scorer"}) || !slices.Equal(d.Weights, []float64{2, 1}) {
					t.Errorf("scorers %v weights %v", d.Scorers, d.Weights)
				}
				if len(d.Candidates) != tc.wantCandidates {
					t.Errorf("%d candidates recorded, want %d", len(d.Candidates), tc.wantCandidates)
				}
				for i, c := range d.Candidates {
					if sum := 2*c.Scores[0] + c.Scores[1]; math.Abs(sum-c.Total) > 1e-9 {
						t.Errorf("candidate %s: scores %v weigh up to %v, total %v", c.Address, c.Scores, sum, c.Total)
					}
					if i < len(d.Picked) && c.Address != d.Picked[i] {
						t.Errorf("candidate %d is %s, want the picked %s first", i, c.Address, d.Picked[i])
					}
					if i > len(d.Picked) && c.Total > d.Candidates[i-1].Total {
						t.Errorf("candidates after the picked ones not by total: %v", d.Candidates)
					}
				}
				// The best unpicked total is the best among the unrecorded too.
				if tc.endpoints > maxRecordedCandidates {
					checkBestKept(t, s, tp, d)
				}
			}
		})
	}
}

// checkBestKept: no candidate left out of the record has a higher total
// than the lowest recorded unpicked one; the pool's metrics are unchanged
// since the pick, so its totals are computed again.
func checkBestKept(t *testing.T, s *Scheduler, tp *schedtest.Pool, d Decision) {
	t.Helper()
	res, err := s.ScheduleDeferred(ctx, tp.Pool, &Request{Model: "m", Scores: true})
	if err != nil {
		t.Fatal(err)
	}
	res.Commit()
	lowest := d.Candidates[len(d.Candidates)-1].Total
	recorded := map[string]bool{}
	for _, c := range d.Candidates {
		recorded[c.Address] = true
	}
	for addr, total := range res.Scores {
		if !recorded[addr] && total > lowest+1e-9 {
			t.Errorf("%s (total %v) left out of the record, whose lowest is %v", addr, total, lowest)
		}
	}
}

// TestRecentDecisionsConcurrent: picks from many goroutines record while a
// reader reads (run with -race); a pool removed drops its decisions.
func TestRecentDecisionsConcurrent(t *testing.T) {
	s := mustScheduler(t, "", Options{DecisionsPerPool: 4})
	tp := newTestPool(t, 5, s)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if _, err := s.Schedule(ctx, tp.Pool, &Request{ID: fmt.Sprint(g, "-", i), Model: "m"}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 50 {
		for _, d := range s.RecentDecisions(tp.Pool) {
			if len(d.Picked) == 0 || len(d.Candidates) == 0 {
				t.Errorf("a decision read half-written: %+v", d)
			}
		}
	}
	wg.Wait()
	if n := len(s.RecentDecisions(tp.Pool)); n == 0 || n > 4 {
		t.Errorf("%d decisions kept, want 1..4", n)
	}
	s.PoolRemoved(tp.Pool)
	if n := len(s.RecentDecisions(tp.Pool)); n != 0 {
		t.Errorf("%d decisions of a removed pool", n)
	}
}

// TestRecordingAllocatesNothing: once a pool's slots have grown, recording
// a decision allocates nothing (counted on the record itself: under -race
// sync.Pool drops cycles at random, which makes a whole pick's count vary).
func TestRecordingAllocatesNothing(t *testing.T) {
	s := mustScheduler(t, twoScorerConfig, Options{DecisionsPerPool: 4})
	tp := newTestPool(t, 20, s)
	prof := s.built.profiles[s.built.defaultProfile]
	cands := schedtest.Candidates(tp.Pool)
	totals := make([]float64, len(cands))
	perScorer := make([]float64, len(prof.scorers)*len(cands))
	for i := range totals {
		totals[i] = float64(i%7) / 7
		perScorer[i] = totals[i]
	}
	picked := []int{3, 1}
	req := &Request{ID: "r"}
	ring := s.decisionRing(tp.Pool)
	for range 8 {
		ring.record(time.Now(), req, "m", prof, cands, totals, perScorer, picked, nil, "")
	}
	if n := testing.AllocsPerRun(200, func() {
		s.decisionRing(tp.Pool).record(time.Now(), req, "m", prof, cands, totals, perScorer, picked, nil, "")
	}); n != 0 {
		t.Errorf("recording a decision allocates %v times", n)
	}
	d := s.RecentDecisions(tp.Pool)[0]
	if len(d.Candidates) != maxRecordedCandidates || d.Candidates[0].Address != cands[3].Endpoint.Address() {
		t.Errorf("recorded %+v", d)
	}
}
