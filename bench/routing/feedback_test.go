// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// feedbackConfig is a prefix-only router whose index believes every
// endpoint's cache unbounded, so it is wrong as soon as a server evicts.
const feedbackConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    autoTune: false
    lruCapacityPerServer: 100000
    usageFeedback: %t
- type: max-score-picker
`

// TestIndexLearnsFromReportedCachedTokens runs prompts through the real
// ext_proc server to a real modelsim server whose KV cache holds two of
// them, and checks the prefix index against the cached tokens the server
// reports in each response's usage. After P0..P3, the server holds P2 and
// P3; P1 comes back and misses although the index predicted it. With
// usage feedback the index then forgets what it believed older than P1
// (P0), so P0's return is predicted a miss; without, it is mispredicted
// again.
func TestIndexLearnsFromReportedCachedTokens(t *testing.T) {
	c := defaultSweep()
	c.servers, c.slots, c.kvBlocks, c.blockTokens = 1, 1, 30, 16
	c.prefixTokens, c.suffixTokens, c.outputTokens = 200, 8, 2
	c.timeScale = 50
	prompt := func(g, i int) []byte {
		prefix := words(rand.New(rand.NewPCG(1, uint64(g)+1)), fmt.Sprintf("system prompt %d: ", g), c.prefixTokens*modelsim.BytesPerToken)
		suffix := words(rand.New(rand.NewPCG(2, uint64(i))), fmt.Sprintf(" question %d: ", i), c.suffixTokens*modelsim.BytesPerToken)
		return fmt.Appendf(nil, `{"model":%q,"prompt":"%s%s","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
			modelsim.DefaultModel, prefix, suffix, c.outputTokens)
	}
	sequence := []int{0, 1, 2, 3, 1, 0}
	cases := []struct {
		feedback bool
		// overPredicted is how many of the requests the index expected
		// cached tokens for that the server did not have.
		overPredicted int64
	}{
		{feedback: true, overPredicted: 1},
		{feedback: false, overPredicted: 2},
	}
	for n, tc := range cases {
		t.Run(fmt.Sprintf("feedback=%t", tc.feedback), func(t *testing.T) {
			ctx := context.Background()
			f, err := startFleet(ctx, 10+n, &c, router{config: fmt.Sprintf(feedbackConfig, tc.feedback)}, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer f.stop()
			var cached []int
			for i, g := range sequence {
				out, err := f.send(ctx, time.Now(), fmt.Sprintf("req-%d", i), objectiveCritical, prompt(g, i))
				if err != nil || out.status != 200 {
					t.Fatalf("request %d: status %d, %v", i, out.status, err)
				}
				cached = append(cached, out.cachedTokens)
			}
			// The server: P1 and P0 came back after being evicted (the
			// server may keep a prompt's first blocks: it frees a
			// sequence's blocks last first).
			for _, i := range []int{4, 5} {
				if cached[i] > c.prefixTokens/2 {
					t.Fatalf("server cached tokens %v: want the returning P1 and P0 to miss", cached)
				}
			}
			a := gatherCounters(f.replicas[0].metrics)
			if a[prefix.MetricPredictions] != int64(len(sequence)) {
				t.Fatalf("%d reports observed, want %d", a[prefix.MetricPredictions], len(sequence))
			}
			if a[prefix.MetricOverPredictions] != tc.overPredicted {
				t.Fatalf("over-predicted %d, want %d (confirmed %d of %d predicted tokens; server cached %v)",
					a[prefix.MetricOverPredictions], tc.overPredicted, a[prefix.MetricConfirmedTokens], a[prefix.MetricPredictedTokens], cached)
			}
		})
	}
}

// TestIndexComparesServerTokens runs prompts through the real ext_proc
// server to a real modelsim server that counts 5 prompt bytes a token,
// where the prefix index estimates 4: the server's cached tokens of a
// prompt it holds whole are 4/5 of the index's estimate. The index scales
// its prediction by the prompt tokens the server reports in the same
// usage, so a prompt the server had whole counts as predicted right (and
// nothing is forgotten); with a server of 4 bytes a token, as before.
func TestIndexComparesServerTokens(t *testing.T) {
	for n, bytesPerToken := range []int{4, 5} {
		t.Run(fmt.Sprintf("%d bytes a token", bytesPerToken), func(t *testing.T) {
			c := defaultSweep()
			c.servers, c.slots, c.kvBlocks, c.blockTokens = 1, 1, 300, 16
			c.prefixTokens, c.suffixTokens, c.outputTokens = 1000, 8, 2
			c.promptBytesPerToken, c.timeScale = bytesPerToken, 50
			prompt := func(g, i int) []byte {
				prefix := words(rand.New(rand.NewPCG(1, uint64(g)+1)), fmt.Sprintf("system prompt %d: ", g), c.prefixTokens*modelsim.BytesPerToken)
				suffix := words(rand.New(rand.NewPCG(2, uint64(i))), fmt.Sprintf(" question %d: ", i), c.suffixTokens*modelsim.BytesPerToken)
				return fmt.Appendf(nil, `{"model":%q,"prompt":"%s%s","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
					modelsim.DefaultModel, prefix, suffix, c.outputTokens)
			}
			ctx := context.Background()
			f, err := startFleet(ctx, 20+n, &c, router{config: fmt.Sprintf(feedbackConfig, true)}, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer f.stop()
			sequence := []int{0, 1, 0, 1, 0}
			var cached, prompts []int
			for i, g := range sequence {
				out, err := f.send(ctx, time.Now(), fmt.Sprintf("req-%d", i), objectiveCritical, prompt(g, i))
				if err != nil || out.status != 200 {
					t.Fatalf("request %d: status %d, %v", i, out.status, err)
				}
				cached, prompts = append(cached, out.cachedTokens), append(prompts, out.promptTokens)
			}
			// The server holds both prompts: from the third request on, each
			// hits on its whole prefix, in the server's tokens.
			for i := 2; i < len(sequence); i++ {
				if want := c.prefixTokens * modelsim.BytesPerToken / bytesPerToken * 9 / 10; cached[i] < want {
					t.Fatalf("server cached tokens %v of %v: want at least %d from the third request on", cached, prompts, want)
				}
			}
			a := gatherCounters(f.replicas[0].metrics)
			if a[prefix.MetricPredictions] != int64(len(sequence)) {
				t.Fatalf("%d reports observed, want %d", a[prefix.MetricPredictions], len(sequence))
			}
			if a[prefix.MetricOverPredictions] != 0 || a[prefix.MetricConfirmedTokens] < a[prefix.MetricPredictedTokens]*95/100 {
				t.Fatalf("over-predicted %d, confirmed %d of %d predicted tokens, want none over and at least 95 %% confirmed (server cached %v of %v)",
					a[prefix.MetricOverPredictions], a[prefix.MetricConfirmedTokens], a[prefix.MetricPredictedTokens], cached, prompts)
			}
		})
	}
}
