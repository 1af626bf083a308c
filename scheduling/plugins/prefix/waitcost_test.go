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
				w.observe(r.uncached, r.ahead, 0, r.ttft)
			}
			got, beyond, ok := w.tokensPerRequest()
			if ok != (c.want > 0) || math.Abs(got-c.want) > c.tolerance || beyond != 0 {
				t.Fatalf("tokens per request ahead %.1f (holds: %v), beyond the batch %.1f, want %v ± %v and none beyond", got, ok, beyond, c.want, c.tolerance)
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
			w.observe(u, float64(k), 0, 30*time.Millisecond+time.Duration(u)*time.Millisecond+time.Duration(k)*perRequest)
		}
	}
	feed(waitCostWindow, 50*time.Millisecond)
	if got, _, _ := w.tokensPerRequest(); math.Abs(got-50) > 2 {
		t.Fatalf("before: %.1f tokens per request ahead, want 50", got)
	}
	feed(4*waitCostWindow, 500*time.Millisecond)
	if got, _, _ := w.tokensPerRequest(); math.Abs(got-500) > 25 {
		t.Fatalf("after: %.1f tokens per request ahead, want 500", got)
	}
}

// TestWaitCostBeyondBatch: with the load beyond the batch given apart, the
// fit finds what a request ahead costs within the batch and what one
// beyond costs besides, where one slope over both finds neither; with
// nothing ever beyond the batch it is the one-slope fit.
func TestWaitCostBeyondBatch(t *testing.T) {
	const batch = 4
	cases := []struct {
		name string
		// most is the most requests ahead of a response.
		most int
		// within and beyond are the tokens wanted (beyond 0: the one-slope
		// fit, within then its figure).
		within, beyond float64
	}{
		{name: "queues beyond the batch", most: 10, within: 28, beyond: 300},
		{name: "never beyond the batch", most: batch, within: 28},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w waitCost
			r := rand.New(rand.NewPCG(5, 6))
			for range 3 * waitCostWindow {
				u, k := r.IntN(2001), r.IntN(c.most+1)
				q := max(k-batch, 0)
				jitter := time.Duration(r.Int64N(int64(20*time.Millisecond))) - 10*time.Millisecond
				w.observe(u, float64(k), float64(q), 30*time.Millisecond+time.Duration(u)*time.Millisecond+time.Duration(k)*28*time.Millisecond+time.Duration(q)*300*time.Millisecond+jitter)
			}
			within, beyond, ok := w.tokensPerRequest()
			if !ok || math.Abs(within-c.within) > 3 || math.Abs(beyond-c.beyond) > 10 {
				t.Fatalf("tokens per request ahead %.1f and beyond the batch %.1f (holds: %v), want %v and %v", within, beyond, ok, c.within, c.beyond)
			}
			// Loads beyond the batch greater than the load itself, or not
			// numbers, are not responses.
			means := func() [4]float64 { return [4]float64{w.u, w.k, w.q, w.y} }
			before := means()
			w.observe(10, 1, 2, time.Second)
			w.observe(10, 1, math.NaN(), time.Second)
			w.observe(10, 1, -1, time.Second)
			if after := means(); after != before {
				t.Fatalf("means %v after bad loads beyond the batch, want %v", after, before)
			}
		})
	}
}

// TestWaitCostBatchSeen: the batch is the most seen, at least 1.
func TestWaitCostBatchSeen(t *testing.T) {
	var w waitCost
	if got := w.batchSeen(); got != 1 {
		t.Fatalf("batch with none seen %v, want 1", got)
	}
	for _, v := range []float64{2, 4.5, 3, math.NaN(), math.Inf(1)} {
		w.seeBatch(v)
	}
	if got := w.batchSeen(); got != 4.5 {
		t.Fatalf("batch %v, want the most seen, 4.5", got)
	}
}
