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
	// The moving means of u (uncached tokens), k (requests ahead), q (of
	// those, the ones beyond the batch: QueueCostBeyondBatch) and y (TTFT
	// in seconds), and of their products.
	u, k, q, y, uu, kk, qq, uk, uq, kq, uy, ky, qy float64
	// tokens is the fit's tokens per request ahead (float64 bits); 0 while
	// the fit does not hold.
	tokens atomic.Uint64
	// batchTokens and beyondTokens are the fit with q: the tokens a
	// request ahead costs and those one beyond the batch costs besides; 0
	// while that fit does not hold (nothing was seen queued).
	batchTokens, beyondTokens atomic.Uint64
	// batch is the most sequences (weighed as load is) a server of the
	// pool was seen running: the requests ahead beyond it wait for a
	// sequence to free (float64 bits).
	batch atomic.Uint64
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
// server's tokens), the load ahead of it at the pick and of that the load
// beyond the batch (loadAtPick), and its TTFT (0: the response was not
// streamed, nothing to learn).
func (w *waitCost) observe(uncached int, ahead, queued float64, ttft time.Duration) {
	if ttft <= 0 || ttft > maxWaitCostTTFT || uncached < 0 || !(ahead >= 0) || math.IsInf(ahead, 1) || !(queued >= 0) || queued > ahead {
		return
	}
	u, k, q, y := float64(uncached), ahead, queued, ttft.Seconds()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n = min(w.n+1, waitCostWindow)
	// The plain mean until the window fills, then a moving one.
	a := 1 / float64(w.n)
	for _, m := range [...]struct {
		mean *float64
		v    float64
	}{{&w.u, u}, {&w.k, k}, {&w.q, q}, {&w.y, y}, {&w.uu, u * u}, {&w.kk, k * k}, {&w.qq, q * q},
		{&w.uk, u * k}, {&w.uq, u * q}, {&w.kq, k * q}, {&w.uy, u * y}, {&w.ky, k * y}, {&w.qy, q * y}} {
		*m.mean += a * (m.v - *m.mean)
	}
	w.tokens.Store(math.Float64bits(w.fitLocked()))
	batch, beyond := w.fitBeyondLocked()
	w.batchTokens.Store(math.Float64bits(batch))
	w.beyondTokens.Store(math.Float64bits(beyond))
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

// fitBeyondLocked solves the least squares of y = a + b·u + c·k + d·q
// and returns c/b and d/b, bounded (d/b at least 0); 0, 0 when the
// responses cannot tell b, c and d apart or a token of prefill costs
// next to nothing.
func (w *waitCost) fitBeyondLocked() (float64, float64) {
	if w.n < waitCostMinResponses {
		return 0, 0
	}
	vu, vk, vq := w.uu-w.u*w.u, w.kk-w.k*w.k, w.qq-w.q*w.q
	cuk, cuq, ckq := w.uk-w.u*w.k, w.uq-w.u*w.q, w.kq-w.k*w.q
	cuy, cky, cqy := w.uy-w.u*w.y, w.ky-w.k*w.y, w.qy-w.q*w.y
	m := [3][3]float64{{vu, cuk, cuq}, {cuk, vk, ckq}, {cuq, ckq, vq}}
	det := det3(m)
	if vu <= 0 || vk <= 0 || vq <= 0 || det <= 1e-6*vu*vk*vq {
		return 0, 0
	}
	// Cramer's rule: each slope is the determinant with its column
	// replaced by the covariances with y.
	slope := func(col int) float64 {
		r := m
		r[0][col], r[1][col], r[2][col] = cuy, cky, cqy
		return det3(r) / det
	}
	perToken, perRequest, perQueued := slope(0), slope(1), slope(2)
	if perToken < minPrefillPerToken {
		return 0, 0
	}
	return min(max(perRequest/perToken, minWaitCostTokens), maxWaitCostTokens),
		min(max(perQueued/perToken, 0), maxWaitCostTokens)
}

func det3(m [3][3]float64) float64 {
	return m[0][0]*(m[1][1]*m[2][2]-m[1][2]*m[2][1]) -
		m[0][1]*(m[1][0]*m[2][2]-m[1][2]*m[2][0]) +
		m[0][2]*(m[1][0]*m[2][1]-m[1][1]*m[2][0])
}

// tokensPerRequest is what a request ahead costs in the servers' prompt
// tokens, what one beyond the batch costs besides (0 when the fit of
// those does not hold, and then the first is the fit over all load), and
// whether the fit holds.
func (w *waitCost) tokensPerRequest() (perRequest, beyond float64, ok bool) {
	if v := math.Float64frombits(w.batchTokens.Load()); v > 0 {
		return v, math.Float64frombits(w.beyondTokens.Load()), true
	}
	v := math.Float64frombits(w.tokens.Load())
	return v, 0, v > 0
}

// seeBatch records that a server was seen running v sequences (weighed
// as load is).
func (w *waitCost) seeBatch(v float64) {
	for {
		old := w.batch.Load()
		if v <= math.Float64frombits(old) || math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		if w.batch.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

// batchSeen is the most sequences a server of the pool was seen running
// (seeBatch), at least 1.
func (w *waitCost) batchSeen() float64 {
	return max(math.Float64frombits(w.batch.Load()), 1)
}

// loadAtPick is the requests e had ahead of the one a PostPick just
// picked it for, counted as the scorer counts a holder's load (per its
// server's share of cacheMean, weighedLoad): the fit learns the cost of
// the load the scores charge, not of a raw request; and of that load the
// part beyond batch (the most sequences a server was seen running,
// weighed alike; 0: not asked). The picker's count holds the picked
// request already, the scrape not yet; a count off by one for every
// request does not move the fit's slopes.
func loadAtPick(e framework.Endpoint, cacheMean, batch float64) (load, queued float64) {
	n := max(e.InFlight()-1, 0)
	m := e.Metrics()
	if !m.IsZero() {
		n = max(n, int64(m.RunningRequests()+m.WaitingRequests()))
	}
	load = weighedLoad(float64(n), m, cacheMean)
	if batch > 0 {
		queued = max(load-batch, 0)
	}
	return load, queued
}
