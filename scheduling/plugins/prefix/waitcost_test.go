// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestWaitCost: the fit finds what a request ahead costs, in tokens of
// prefill, from responses whose TTFT is a fixed part, a part per uncached
// token and a part per request ahead, with noise; it holds only with
// enough responses and spread in both, and is bounded.
func TestWaitCost(t *testing.T) {
	type response struct {
		uncached int
		ahead    float64
		ttft     time.Duration
	}
	// server answers n responses of a server whose prefill takes perToken
	// a token and whose requests ahead cost perRequest each, over the given
	// spreads of uncached tokens and requests ahead, TTFT noise up to
	// ±noise.
	server := func(n int, perToken, perRequest time.Duration, uncached, ahead int, noise time.Duration) []response {
		r := rand.New(rand.NewPCG(1, 2))
		out := make([]response, n)
		for i := range out {
			u, k := r.IntN(uncached+1), r.IntN(ahead+1)
			jitter := time.Duration(0)
			if noise > 0 {
				jitter = time.Duration(r.Int64N(int64(2*noise))) - noise
			}
			out[i] = response{u, float64(k), 30*time.Millisecond + time.Duration(u)*perToken + time.Duration(k)*perRequest + jitter}
		}
		return out
	}
	cases := []struct {
		name      string
		responses []response
		// want is the tokens per request ahead (0: the fit does not hold),
		// within tolerance.
		want, tolerance float64
	}{
		{name: "llm-d simulator at chat", responses: server(200, time.Millisecond, 87*time.Millisecond, 2000, 5, 20*time.Millisecond), want: 87, tolerance: 5},
		{name: "a queue dearer than prefill", responses: server(300, 200*time.Microsecond, 400*time.Millisecond, 4000, 20, 50*time.Millisecond), want: 2000, tolerance: 100},
		{name: "too few responses", responses: server(waitCostMinResponses-1, time.Millisecond, 87*time.Millisecond, 2000, 5, 0)},
		{name: "every response at one load", responses: server(200, time.Millisecond, 87*time.Millisecond, 2000, 0, 0)},
		{name: "every response all cached", responses: server(200, time.Millisecond, 87*time.Millisecond, 0, 5, 0)},
		{name: "load costs nothing: the floor", responses: server(200, time.Millisecond, 0, 2000, 5, 0), want: minWaitCostTokens},
		{name: "prefill costs nothing: no trade", responses: server(200, 0, 87*time.Millisecond, 2000, 5, 0)},
		{name: "prefill nearly free: the ceiling", responses: server(200, time.Microsecond, time.Second, 2000, 5, 0), want: maxWaitCostTokens},
		{name: "unstreamed and stalled responses teach nothing", responses: append(server(waitCostMinResponses-1, time.Millisecond, 87*time.Millisecond, 2000, 5, 0),
			response{100, 1, 0}, response{100, 1, -time.Second}, response{100, 1, time.Hour}, response{-1, 1, time.Second}, response{1, -1, time.Second}, response{1, math.NaN(), time.Second}, response{1, math.Inf(1), time.Second})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w waitCost
			for _, r := range c.responses {
				w.observe(r.uncached, r.ahead, r.ttft)
			}
			got, ok := w.tokensPerRequest()
			if ok != (c.want > 0) || math.Abs(got-c.want) > c.tolerance {
				t.Fatalf("tokens per request ahead %.1f (holds: %v), want %v ± %v", got, ok, c.want, c.tolerance)
			}
		})
	}
}

// TestWaitCostFollowsTheServers: the fit follows a change of the servers
// within a window of responses.
func TestWaitCostFollowsTheServers(t *testing.T) {
	var w waitCost
	r := rand.New(rand.NewPCG(3, 4))
	feed := func(n int, perRequest time.Duration) {
		for range n {
			u, k := r.IntN(2001), r.IntN(6)
			w.observe(u, float64(k), 30*time.Millisecond+time.Duration(u)*time.Millisecond+time.Duration(k)*perRequest)
		}
	}
	feed(waitCostWindow, 50*time.Millisecond)
	if got, _ := w.tokensPerRequest(); math.Abs(got-50) > 2 {
		t.Fatalf("before: %.1f tokens per request ahead, want 50", got)
	}
	feed(4*waitCostWindow, 500*time.Millisecond)
	if got, _ := w.tokensPerRequest(); math.Abs(got-500) > 25 {
		t.Fatalf("after: %.1f tokens per request ahead, want 500", got)
	}
}
