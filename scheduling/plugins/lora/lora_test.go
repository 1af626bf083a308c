// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package lora

import (
	"context"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

var ctx = context.Background()

func TestLoRAAffinityScorer(t *testing.T) {
	m := func(running, waiting []string, max int) *datastore.Metrics {
		return &datastore.Metrics{RunningAdapters: running, WaitingAdapters: waiting, MaxAdapters: max, ScrapedAt: time.Now()}
	}
	cases := []struct {
		name  string
		model string
		m     *datastore.Metrics
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
			tp := schedtest.NewPool(t, 1)
			cands := []framework.Candidate{{Endpoint: dsview.Endpoint(tp.Ep(t, 1)), Metrics: dsview.Metrics(c.m)}}
			scores := make([]float64, 1)
			schedtest.Build(t, "test", NewAffinity, "").(framework.Scorer).Score(ctx, schedtest.NewCycle(tp.Pool, c.model, 1), &framework.Request{}, cands, scores)
			if scores[0] != c.want {
				t.Fatalf("score %v, want %v", scores[0], c.want)
			}
		})
	}
	// The order the scorer promises.
	if !(loraRunning > loraWaitingFree && loraWaitingFree > loraFreeSlot && loraFreeSlot > loraWaitingFull && loraWaitingFull > loraFull) {
		t.Fatal("LoRA tiers out of order")
	}
}
