// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// One pool whose pods cannot be listed is refused on its own, naming why,
// while the picker stays ready and the other pools are served.
func TestUnsyncedPoolRefusedAlone(t *testing.T) {
	f := newPools(t, 3, 2)
	broken := f.pools[1]
	broken.SetSynced(false)
	var controllerSynced atomic.Bool
	controllerSynced.Store(true)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, PoolsSynced: controllerSynced.Load})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthClient(t, ts.healthAddr).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)

	tests := []struct {
		name   string
		reason string
		want   string
	}{
		{"not listed yet", "", "its pods are not listed yet"},
		{"listing failed", `pod list: pods is forbidden: User "picker" cannot list resource "pods"`, `its pods cannot be listed: pod list: pods is forbidden`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken.SetSyncError(tt.reason)
			g := ts.open(t, authorityOf(1), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
			code, body := immediateCode(t, g.recv())
			if code != 503 || !strings.Contains(body, tt.want) || !strings.Contains(body, broken.Key.String()) {
				t.Fatalf("broken pool answered %d %s, want 503 naming the pool and %q", code, body, tt.want)
			}
			for _, i := range []int{0, 2} {
				g := ts.open(t, authorityOf(i), nil)
				g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
				r := g.recv()
				if r.GetImmediateResponse() != nil {
					t.Fatalf("pool %d refused beside the broken one: %s", i, r.GetImmediateResponse().GetBody())
				}
				destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
			}
		})
	}
	if !ts.srv.Ready() {
		t.Fatal("one broken pool made the picker unready")
	}
}

// On shutdown readiness turns NOT_SERVING at once, yet streams opened during
// the grace period are still taken and answered; then the server stops.
func TestDrainGracePeriodAcceptsNewStreams(t *testing.T) {
	f := newPools(t, 1, 2)
	const grace = 3 * time.Second
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, DrainGracePeriod: grace, DrainTimeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := healthClient(t, ts.healthAddr).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
	ts.cancel() // SIGTERM
	awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	if ts.srv.Ready() {
		t.Fatal("Ready while draining")
	}
	// A gateway that has not yet seen the drain opens a new stream.
	g := ts.open(t, "", nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
	r := g.recv()
	destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation())
	g.send(respHeaders([]hdr{{":status", "200", true}}, false, ""))
	g.recv()
	g.send(respBody([]byte(`{}`), true))
	g.recv()
	g.expectEOF()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Fatal(err)
		}
		ts.done <- nil // for the cleanup
	case <-time.After(grace + 10*time.Second):
		t.Fatal("Start did not return after the grace period and the drain")
	}
	if f.totalInFlight() != 0 {
		t.Fatal("in-flight left")
	}
}
