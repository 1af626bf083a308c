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

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/internal/localstack"
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
	// The leader writes the requests-waiting annotation for the requests
	// in its own waiting room: another request goes to the pool until the
	// leader holds one (streams are spread over the replicas).
	for n := 0; waitingRoomOf(t, leader(t), cold.key()) == 0; n++ {
		if n == 8 {
			t.Fatalf("8 more requests to %s, none waiting in the leader", cold.key())
		}
		go func() {
			coldOut <- send(ctx, cold.host, "/v1/completions", completion(modelsim.DefaultModel, "wake up", 2, false), nil)
		}()
		eventually(t, "one more request waiting for "+cold.key().String(), func() bool { return waitingRoom(t, cold.key()) > float64(n+1) })
	}
	eventually(t, "the "+controllers.RequestsWaitingAnnotation+" annotation on "+cold.key().String(), func() bool {
		return poolAnnotation(t, cold.key()) == "1"
	})
	select {
	case o := <-coldOut:
		t.Fatalf("request to a pool without pods answered before any pod came: %v", o)
	default:
	}

	sent := int(waitingRoom(t, cold.key()))
	addDeployment(t, cold.ns, cold.deploy.Name, 1, "--port=8000")
	for i := 0; i < sent; i++ {
		if o := <-coldOut; !o.ok() {
			t.Fatalf("request waiting for the first pod: %v", o)
		}
	}
	t.Logf("first requests to the pool scaled from zero served after %v", time.Since(start).Round(time.Millisecond))
	if n := waitingRoom(t, cold.key()); n != 0 {
		t.Fatalf("waiting room gauge %v after the requests were served", n)
	}
	eventually(t, "the "+controllers.RequestsWaitingAnnotation+" annotation gone from "+cold.key().String(), func() bool {
		return poolAnnotation(t, cold.key()) == ""
	})

	o := <-neverOut
	if o.code != http.StatusServiceUnavailable || !strings.Contains(o.body, "NoEndpointsTimeout") {
		t.Fatalf("request to a pool whose pods never come: %v, want 503 NoEndpointsTimeout", o)
	}
	if waited := time.Since(start); waited < noEndpointTTL {
		t.Fatalf("answered after %v, before the waiting room's TTL of %v", waited, noEndpointTTL)
	}
	eventually(t, "no "+controllers.RequestsWaitingAnnotation+" annotation on "+never.key().String()+" once its request timed out", func() bool {
		return poolAnnotation(t, never.key()) == ""
	})
}

// poolAnnotation is the pool's requests-waiting annotation ("" when absent).
func poolAnnotation(t *testing.T, key types.NamespacedName) string {
	t.Helper()
	var p v1.InferencePool
	if err := stack.Client().Get(context.Background(), key, &p); err != nil {
		t.Fatalf("get pool %s: %v", key, err)
	}
	return p.Annotations[controllers.RequestsWaitingAnnotation]
}

// leader is the replica that holds the Lease (poolpicker_leader 1).
func leader(t *testing.T) *localstack.Replica {
	t.Helper()
	var l *localstack.Replica
	eventually(t, "a leader among the replicas", func() bool {
		for _, r := range stack.Replicas() {
			if gaugeOf(t, r, "poolpicker_leader", nil) == 1 {
				l = r
				return true
			}
		}
		return false
	})
	return l
}

// waitingRoomOf is replica r's waiting-room gauge of pool.
func waitingRoomOf(t *testing.T, r *localstack.Replica, pool types.NamespacedName) float64 {
	t.Helper()
	return gaugeOf(t, r, "inference_extension_flow_control_waiting_room_requests", map[string]string{"namespace": pool.Namespace, "pool": pool.Name})
}

// gaugeOf sums the series of gauge name on replica r whose labels include
// want; 0 when r does not answer.
func gaugeOf(t *testing.T, r *localstack.Replica, name string, want map[string]string) float64 {
	t.Helper()
	resp, err := client.Get("http://" + r.MetricsAddr + "/metrics")
	if err != nil {
		return 0 // a replica restarting
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse picker metrics: %v", err)
	}
	var n float64
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if match {
			n += m.GetGauge().GetValue()
		}
	}
	return n
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
