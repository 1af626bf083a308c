// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/internal/eppclient"
)

// gateway sends requests to poolpicker's ext_proc server as a gateway does:
// request headers and body on a full-duplex stream, the pool named by the
// x-gateway-inference-pool metadata (one of the ways site-src/protocols.md
// lists), the destination read from the answer.
type gateway struct {
	client *eppclient.Client
	req    eppclient.Request
}

func newGateway(addr string) (*gateway, error) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Summarise the scale benchmark in one sentence.","max_tokens":16}`)
	return &gateway{
		// poolpicker serves ext_proc over TLS with a self-signed certificate
		// by default, as gateways accept it.
		client: eppclient.New(addr, eppclient.Options{TLS: true}),
		req: eppclient.Request{Shape: eppclient.FullDuplex, Body: body, Headers: []eppclient.Header{
			{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
			{Key: ":authority", Value: "gw.example"}, {Key: "content-type", Value: "application/json"},
			{Key: "content-length", Value: fmt.Sprint(len(body))}}},
	}, nil
}

func (g *gateway) close() { _ = g.client.Close() }

// pick is one request's outcome.
type pick struct {
	pool    int
	addr    int // pod index of the primary destination
	sent    time.Time
	latency time.Duration // stream opened to destination received
}

// pick sends one request for pool and returns when the stream is done.
func (g *gateway) pick(ctx context.Context, c config, pool int) (pick, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := g.req
	req.PoolTag = namespace(pool, c.Namespaces) + "/" + poolName(pool)
	out := pick{pool: pool, sent: time.Now()}
	res, err := g.client.Do(ctx, req)
	if err != nil {
		return out, err
	}
	out.latency = res.Decided
	if res.Destination == "" {
		return out, fmt.Errorf("pool %d: no destination in %+v", pool, res)
	}
	primary := res.Endpoints()[0]
	host, _, err := net.SplitHostPort(primary)
	if err != nil {
		return out, fmt.Errorf("destination %q: %w", res.Destination, err)
	}
	i, ok := podIndex(net.ParseIP(host))
	if !ok || i/c.Pods != pool {
		return out, fmt.Errorf("pool %d routed to %s, not one of its pods", pool, primary)
	}
	out.addr = i
	return out, nil
}

// hotTraffic sends requests to the hot pools as Poisson arrivals of rate
// per second, each to a pool drawn at random (periodic arrivals would lock
// in phase with the refresh interval and bias the metric age), for d, with
// up to 64 in flight; it returns every pick. With load's times above zero,
// hot[0] gets times each other pool's requests (the others keep theirs);
// with its interleave, only in every other slice (in the others, as each
// other pool).
func hotTraffic(ctx context.Context, g *gateway, c config, hot []int, rate float64, load neighbourLoad, d time.Duration) ([]pick, error) {
	var (
		mu       sync.Mutex
		picks    []pick
		firstErr error
		wg       sync.WaitGroup
	)
	rng := rand.New(rand.NewPCG(uint64(len(hot)), uint64(time.Now().UnixNano())))
	sem := make(chan struct{}, 64)
	noisy := load.times
	if noisy > 0 && len(hot) > 1 {
		rate *= (float64(len(hot)-1) + noisy) / float64(len(hot))
	}
	start := time.Now()
	end := start.Add(d)
	next := time.Now()
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if next.After(end) {
			break
		}
		if err := sleep(ctx, time.Until(next)); err != nil {
			wg.Wait()
			return picks, err
		}
		pool := hot[rng.IntN(len(hot))]
		if noisy > 0 && len(hot) > 1 {
			// The noisy pool, hot[0], weighs noisy others.
			if u := rng.Float64() * (float64(len(hot)-1) + noisy); u < noisy {
				// In a quiet slice, thinned to one other's rate.
				if load.interleave > 0 && !loudAt(start, next, load.interleave) && rng.Float64()*noisy >= 1 {
					continue
				}
				pool = hot[0]
			} else {
				pool = hot[1+min(int(u-noisy), len(hot)-2)]
			}
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // 64 in flight: the picker is behind; count what it answers
		}
		wg.Go(func() {
			defer func() { <-sem }()
			p, err := g.pick(ctx, c, pool)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			picks = append(picks, p)
		})
	}
	wg.Wait()
	return picks, firstErr
}
