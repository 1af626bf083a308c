// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// waitCost learns from a pool's responses what one request ahead on an
// endpoint costs a request's time to first token, counted in prompt
// tokens prefilled (Params.QueueCostFromServers): a least-squares fit of
// each response's TTFT against its uncached prompt tokens and the
// requests its endpoint had ahead of it at the pick, over the recent
// responses. The fit's two slopes are the seconds a token of prefill
// takes and the seconds a request ahead adds; their ratio is the
// trade the prefix scorer weighs, a holder's extra load against the
// prefill a miss costs elsewhere, as the pool's servers measure it.
type waitCost struct {
	mu sync.Mutex
	// n is the responses folded in, up to waitCostWindow.
	n int
	// The moving means of u (uncached tokens), k (requests ahead) and y
	// (TTFT in seconds), and of their products.
	u, k, y, uu, kk, uk, uy, ky float64
	// tokens is the fit's tokens per request ahead (float64 bits); 0 while
	// the fit does not hold.
	tokens atomic.Uint64
}

const (
	// waitCostWindow is the weight of the newest response, 1/waitCostWindow,
	// once that many are folded in: the fit follows the last few hundred
	// responses, so it moves with the pool's load and its servers.
	waitCostWindow = 256
	// waitCostMinResponses is how many responses the fit needs before it
	// is used.
	waitCostMinResponses = 32
	// maxWaitCostTTFT bounds the TTFTs the fit takes: a longer one is a
	// stalled stream, not a server's queue.
	maxWaitCostTTFT = 10 * time.Minute
	// minWaitCostTokens is the least a request ahead costs: a fit that
	// finds the load free (or faster) still prefers the less loaded of
	// two equal holders.
	minWaitCostTokens = 8
	// maxWaitCostTokens is the most: more than any prompt's prefill, so a
	// holder that busy always gives way.
	maxWaitCostTokens = 1 << 16
	// minPrefillPerToken is the least time, in seconds, a token of prefill
	// takes for the fit to hold: below it the responses show no trade
	// between prefill and load, only noise.
	minPrefillPerToken = 1e-7
)

// observe folds in one response: its uncached prompt tokens (in the
// server's tokens), the load ahead of it at the pick (loadAtPick), and its TTFT
// (0: the response was not streamed, nothing to learn).
func (w *waitCost) observe(uncached int, ahead float64, ttft time.Duration) {
	if ttft <= 0 || ttft > maxWaitCostTTFT || uncached < 0 || !(ahead >= 0) || math.IsInf(ahead, 1) {
		return
	}
	u, k, y := float64(uncached), ahead, ttft.Seconds()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n = min(w.n+1, waitCostWindow)
	// The plain mean until the window fills, then a moving one.
	a := 1 / float64(w.n)
	for _, m := range [...]struct {
		mean *float64
		v    float64
	}{{&w.u, u}, {&w.k, k}, {&w.y, y}, {&w.uu, u * u}, {&w.kk, k * k}, {&w.uk, u * k}, {&w.uy, u * y}, {&w.ky, k * y}} {
		*m.mean += a * (m.v - *m.mean)
	}
	w.tokens.Store(math.Float64bits(w.fitLocked()))
}

// fitLocked solves the least squares of y = a + b·u + c·k and returns
// c/b, bounded; 0 when the responses cannot tell b and c apart (too few,
// no spread in one of u and k, or the two moving together) or a token
// of prefill costs next to nothing.
func (w *waitCost) fitLocked() float64 {
	if w.n < waitCostMinResponses {
		return 0
	}
	vu, vk := w.uu-w.u*w.u, w.kk-w.k*w.k
	cuk, cuy, cky := w.uk-w.u*w.k, w.uy-w.u*w.y, w.ky-w.k*w.y
	det := vu*vk - cuk*cuk
	if vu <= 0 || vk <= 0 || det <= 1e-6*vu*vk {
		return 0
	}
	perToken := (cuy*vk - cky*cuk) / det
	perRequest := (cky*vu - cuy*cuk) / det
	if perToken < minPrefillPerToken {
		return 0
	}
	return min(max(perRequest/perToken, minWaitCostTokens), maxWaitCostTokens)
}

// tokensPerRequest is what a request ahead costs in the servers' prompt
// tokens, and whether the fit holds.
func (w *waitCost) tokensPerRequest() (float64, bool) {
	v := math.Float64frombits(w.tokens.Load())
	return v, v > 0
}

// loadAtPick is the requests e had ahead of the one a PostPick just
// picked it for, counted as the scorer counts a holder's load (per its
// server's share of cacheMean, weighedLoad): the fit learns the cost of
// the load the scores charge, not of a raw request. The picker's count
// holds the picked request already, the scrape not yet; a count off by
// one for every request does not move the fit's slopes.
func loadAtPick(e framework.Endpoint, cacheMean float64) float64 {
	n := max(e.InFlight()-1, 0)
	m := e.Metrics()
	if !m.IsZero() {
		n = max(n, int64(m.RunningRequests()+m.WaitingRequests()))
	}
	return weighedLoad(float64(n), m, cacheMean)
}
