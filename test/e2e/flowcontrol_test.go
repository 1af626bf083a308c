// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// noEndpointTTL is the waiting room's TTL in TestScaleFromZero: long enough
// for a loaded machine to start a model server, short enough for the suite.
const noEndpointTTL = 40 * time.Second

// With flow control's waiting room, a request to a pool scaled to zero
// waits (instead of a 503) while the picker tells autoscalers (a gauge and
// an Event on the pool); the pool's first Ready pod serves it. A pool whose
// pods never come answers 503 NoEndpointsTimeout once the TTL ends.
func TestScaleFromZero(t *testing.T) {
	ctx := context.Background()
	cold := emptyPool(t, "cold")
	never := emptyPool(t, "never")
	withPickerArgs(t, "--flow-control", "--flow-control-no-endpoint-ttl="+noEndpointTTL.String())

	coldOut, neverOut := make(chan outcome, 1), make(chan outcome, 1)
	start := time.Now()
	go func() {
		coldOut <- send(ctx, cold.host, "/v1/completions", completion(modelsim.DefaultModel, "wake up", 2, false), nil)
	}()
	go func() {
		neverOut <- send(ctx, never.host, "/v1/completions", completion(modelsim.DefaultModel, "nobody home", 2, false), nil)
	}()

	eventually(t, "a request in the waiting room of "+cold.key().String(), func() bool {
		return waitingRoom(t, cold.key()) > 0
	})
	eventually(t, "a RequestsWaiting Event on "+cold.key().String(), func() bool {
		var evs eventsv1.EventList
		if err := stack.Client().List(ctx, &evs, crclient.InNamespace(cold.ns)); err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "RequestsWaiting" && e.Regarding.Kind == "InferencePool" && e.Regarding.Name == cold.name {
				return true
			}
		}
		return false
	})
	select {
	case o := <-coldOut:
		t.Fatalf("request to a pool without pods answered before any pod came: %v", o)
	default:
	}

	addDeployment(t, cold.ns, cold.deploy.Name, 1, "--port=8000")
	if o := <-coldOut; !o.ok() {
		t.Fatalf("request waiting for the first pod: %v", o)
	}
	t.Logf("first request to the pool scaled from zero served after %v", time.Since(start).Round(time.Millisecond))
	if n := waitingRoom(t, cold.key()); n != 0 {
		t.Fatalf("waiting room gauge %v after the request was served", n)
	}

	o := <-neverOut
	if o.code != http.StatusServiceUnavailable || !strings.Contains(o.body, "NoEndpointsTimeout") {
		t.Fatalf("request to a pool whose pods never come: %v, want 503 NoEndpointsTimeout", o)
	}
	if waited := time.Since(start); waited < noEndpointTTL {
		t.Fatalf("answered after %v, before the waiting room's TTL of %v", waited, noEndpointTTL)
	}
}

// emptyPool creates a pool (as newPool) whose Deployment does not exist
// yet, and waits until the picker answers for it (503: no endpoint).
func emptyPool(t *testing.T, name string) testPool {
	t.Helper()
	ctx := context.Background()
	p := testPool{ns: "e2e-" + name, name: name, host: name + ".e2e.example", deploy: types.NamespacedName{Namespace: "e2e-" + name, Name: name + "-v1"}}
	if err := stack.Apply(ctx, fill(poolManifest, "{{ns}}", p.ns, "{{name}}", name)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the picker answering for "+p.key().String(), func() bool {
		o := send(ctx, p.host, "/v1/completions", completion(modelsim.DefaultModel, "ping", 1, false), nil)
		return o.code == http.StatusServiceUnavailable && strings.Contains(o.body, "no ready endpoints")
	})
	return p
}

// waitingRoom sums the waiting-room gauge of pool over the replicas.
func waitingRoom(t *testing.T, pool types.NamespacedName) float64 {
	t.Helper()
	var n float64
	for _, r := range stack.Replicas() {
		resp, err := client.Get("http://" + r.MetricsAddr + "/metrics")
		if err != nil {
			continue // a replica restarting
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("parse picker metrics: %v", err)
		}
		for _, m := range fams["inference_extension_flow_control_waiting_room_requests"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == pool.Namespace && labels["pool"] == pool.Name {
				n += m.GetGauge().GetValue()
			}
		}
	}
	return n
}
