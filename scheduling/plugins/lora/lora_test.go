// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package lora

import (
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

func TestLoRAAffinityScorer(t *testing.T) {
	m := func(running, waiting []string, max int) *framework.Scrape {
		return &framework.Scrape{RunningAdapters: running, WaitingAdapters: waiting, MaxAdapters: max, ScrapedAt: time.Now()}
	}
	cases := []struct {
		name  string
		model string
		m     *framework.Scrape
		want  float64
	}{
		{"running", "a", m([]string{"x", "a"}, nil, 2), loraRunning},
		{"running and waiting", "a", m([]string{"a"}, []string{"a"}, 1), loraRunning},
		{"waiting, slot free", "a", m([]string{"x"}, []string{"a"}, 2), loraWaitingFree},
		{"waiting, max unknown", "a", m([]string{"x", "y", "z"}, []string{"a"}, 0), loraWaitingFree},
		{"waiting behind full slots", "a", m([]string{"x", "y"}, []string{"a"}, 2), loraWaitingFull},
		{"absent, slot free", "a", m([]string{"x"}, nil, 2), loraFreeSlot},
		{"absent, slots taken by waiting adapters", "a", m([]string{"x"}, []string{"y"}, 2), loraFull},
		{"absent, full", "a", m([]string{"x", "y"}, nil, 2), loraFull},
		{"absent, no LoRA on the server", "base", m(nil, nil, 0), loraFreeSlot},
		{"unknown metrics", "a", nil, 0},
		{"no model", "", nil, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := frameworktest.NewEndpoint("127.0.1.1:8000", nil)
			e.SetScrape(c.m)
			cs := frameworktest.NewCycle(frameworktest.NewPool("ns", "pool", e), c.model, 1)
			s := frameworktest.Build(t, NewAffinity, "test", "").(framework.Scorer)
			scores, st := frameworktest.Score(t, s, cs, &framework.Request{}, frameworktest.Candidates(cs))
			if st != nil || scores[0] != c.want {
				t.Fatalf("score %v, status %v; want %v and none", scores[0], st, c.want)
			}
		})
	}
	// The order the scorer promises.
	if !(loraRunning > loraWaitingFree && loraWaitingFree > loraFreeSlot && loraFreeSlot > loraWaitingFull && loraWaitingFull > loraFull) {
		t.Fatal("LoRA tiers out of order")
	}
}
