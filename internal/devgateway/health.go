// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthService is the gRPC health service whose status gates a picker:
// the one its readiness probe (and so its Service endpoints) follows.
const HealthService = "readiness"

// readiness follows a picker's gRPC health service, standing in for what a
// cluster does with a readiness probe: a Service sends traffic only to
// Ready endpoints, so a gateway never reaches a picker that is starting
// (pools not yet synced) or draining.
type readiness struct {
	addr string
	log  func(ready bool)

	mu    sync.Mutex
	ready bool
	// changed is closed and replaced whenever ready changes.
	changed chan struct{}
}

func newReadiness(addr string, log func(bool)) *readiness {
	return &readiness{addr: addr, log: log, changed: make(chan struct{})}
}

// state returns the readiness and a channel closed at its next change.
func (r *readiness) state() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready, r.changed
}

func (r *readiness) set(ready bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ready == ready {
		return
	}
	r.ready = ready
	close(r.changed)
	r.changed = make(chan struct{})
	if r.log != nil {
		r.log(ready)
	}
}

// run watches the health service until ctx ends, reconnecting as needed.
func (r *readiness) run(ctx context.Context) {
	cc, err := grpc.NewClient("passthrough:///"+r.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for ctx.Err() == nil {
		stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthService}, grpc.WaitForReady(true))
		if err == nil {
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				r.set(resp.GetStatus() == healthpb.HealthCheckResponse_SERVING)
			}
		}
		r.set(false)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}
