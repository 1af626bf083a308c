// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/poolpicker/poolpicker/extproc"
)

// gateway sends requests to poolpicker's ext_proc server as a gateway does:
// request headers and body on a full-duplex stream, the pool named by the
// x-gateway-inference-pool metadata (one of the ways site-src/protocols.md
// lists), the destination read from the answer.
type gateway struct {
	conn    *grpc.ClientConn
	headers *extprocv3.ProcessingRequest
	body    *extprocv3.ProcessingRequest
}

func newGateway(addr string) (*gateway, error) {
	// poolpicker serves ext_proc over TLS with a self-signed certificate by
	// default, as gateways accept it.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))) //nolint:gosec // loopback, self-signed
	if err != nil {
		return nil, err
	}
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Summarise the scale benchmark in one sentence.","max_tokens":16}`)
	return &gateway{
		conn: conn,
		headers: &extprocv3.ProcessingRequest{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
				{Key: ":authority", RawValue: []byte("gw.example")}, {Key: "content-type", RawValue: []byte("application/json")},
				{Key: "content-length", RawValue: []byte(fmt.Sprint(len(body)))}}}}},
		},
		body: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}, nil
}

func (g *gateway) close() { g.conn.Close() }

// pick is one request's outcome.
type pick struct {
	pool    int
	addr    int // pod index of the primary destination
	sent    time.Time
	latency time.Duration // first message sent to destination received
}

// pick sends one request for pool and returns when the stream is done.
func (g *gateway) pick(ctx context.Context, c config, pool int) (pick, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-gateway-inference-pool", namespace(pool, c.Namespaces)+"/"+poolName(pool))
	out := pick{pool: pool, sent: time.Now()}
	s, err := extprocv3.NewExternalProcessorClient(g.conn).Process(ctx)
	if err != nil {
		return out, err
	}
	if err := s.Send(g.headers); err != nil {
		return out, err
	}
	if err := s.Send(g.body); err != nil {
		return out, err
	}
	r, err := s.Recv()
	if err != nil {
		return out, err
	}
	out.latency = time.Since(out.sent)
	dest := ""
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.HeaderDestination {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	if dest == "" {
		return out, fmt.Errorf("pool %d: no destination in %v", pool, r)
	}
	primary, _, _ := cutComma(dest)
	host, _, err := net.SplitHostPort(primary)
	if err != nil {
		return out, fmt.Errorf("destination %q: %w", dest, err)
	}
	i, ok := podIndex(net.ParseIP(host))
	if !ok || i/c.Pods != pool {
		return out, fmt.Errorf("pool %d routed to %s, not one of its pods", pool, primary)
	}
	out.addr = i
	if _, err := s.Recv(); err != nil { // the body's answer
		return out, err
	}
	if err := s.CloseSend(); err != nil {
		return out, err
	}
	if _, err := s.Recv(); err != io.EOF {
		return out, fmt.Errorf("want the stream's end, got %v", err)
	}
	return out, nil
}

func cutComma(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// hotTraffic sends requests to the hot pools as Poisson arrivals of rate
// per second, each to a pool drawn at random (periodic arrivals would lock
// in phase with the refresh interval and bias the metric age), for d, with
// up to 64 in flight; it returns every pick. With noisy above zero, hot[0]
// gets noisy times each other pool's requests (the others keep theirs).
func hotTraffic(ctx context.Context, g *gateway, c config, hot []int, rate, noisy float64, d time.Duration) ([]pick, error) {
	var (
		mu       sync.Mutex
		picks    []pick
		firstErr error
		wg       sync.WaitGroup
	)
	rng := rand.New(rand.NewPCG(uint64(len(hot)), uint64(time.Now().UnixNano())))
	sem := make(chan struct{}, 64)
	if noisy > 0 && len(hot) > 1 {
		rate *= (float64(len(hot)-1) + noisy) / float64(len(hot))
	}
	end := time.Now().Add(d)
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
		select {
		case sem <- struct{}{}:
		default:
			continue // 64 in flight: the picker is behind; count what it answers
		}
		pool := hot[rng.IntN(len(hot))]
		if noisy > 0 && len(hot) > 1 {
			// The noisy pool, hot[0], weighs noisy others.
			if u := rng.Float64() * (float64(len(hot)-1) + noisy); u < noisy {
				pool = hot[0]
			} else {
				pool = hot[1+min(int(u-noisy), len(hot)-2)]
			}
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
