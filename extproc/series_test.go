// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
)

// exchange sends one request for the pool behind authority with model
// over real gRPC, and its response, and checks it was routed.
func exchange(t testing.TB, ts *testServer, authority, model string) {
	t.Helper()
	g := ts.open(t, authority, nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	g.send(reqBody(completionBody(model, 1), true))
	hr := g.recv()
	destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation())
	g.recv() // the body
	g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", "application/json", true}}, false, ""))
	g.recv()
	g.send(respBody([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":2}}`), true))
	g.recv()
	g.expectEOF()
}

// seriesOf gathers the server's registry: every series by metric name and
// label pairs, and their count.
func seriesOf(t testing.TB, ts *testServer) (n int, text string) {
	t.Helper()
	mfs, err := ts.prom.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			n++
			fmt.Fprintf(&b, "%s%s\n", mf.GetName(), labelText(m))
		}
	}
	return n, b.String()
}

func labelText(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestSeriesBoundedUnderChurn churns pools (one added and one removed per
// round), the pods of a pool that stays, and model names, with real
// requests between, and checks that the request metrics' series count
// stays the same from cycle to cycle of the pools' namespaces, that no
// series names a removed pool
// or pod, that model names beyond the cap are "other", and that the names
// the pool's rewrites mention are kept however many others came first.
func TestSeriesBoundedUnderChurn(t *testing.T) {
	const rounds, podsPerPool, maxModels = 12, 2, 4
	f := newPools(t, 1, podsPerPool)
	stay := f.pools[0]
	stay.SetPolicy(&datastore.Policy{Rewrites: map[string][]datastore.RewriteTarget{"alias": {{Model: "served-model", Weight: 1, Rewrite: "rw"}}}})
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxModelLabels: maxModels})

	var counts []int
	var gonePools, gonePods []string
	for r := 1; r <= rounds; r++ {
		// A new pool serves a request; last round's pool goes.
		f.add(r, poolNS(r), poolName(r), poolSvc(r), 9002, podsPerPool)
		exchange(t, ts, authorityOf(r), fmt.Sprintf("model-%d", r))
		if r > 1 {
			f.reg.Remove(datastore.PoolKey{Namespace: poolNS(r - 1), Name: poolName(r - 1)})
			gonePools = append(gonePools, fmt.Sprintf(`pool=%q`, poolName(r-1)))
		}
		// The pool that stays gets new pods (a rollout), and requests for
		// a new model name, an old one, and the rewritten one.
		var pods []datastore.EndpointSource
		for _, e := range stay.Endpoints().Endpoints {
			gonePods = append(gonePods, fmt.Sprintf(`pod_name=%q`, e.Pod.Name))
		}
		for j := 0; j < podsPerPool; j++ {
			name := fmt.Sprintf("stay-r%d-%d", r, j)
			pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: poolNS(0), Name: name}, UID: types.UID(name), IP: fmt.Sprintf("127.0.1.%d", j+2)})
		}
		stay.SetPods(pods)
		for _, m := range []string{fmt.Sprintf("fresh-%d", r), "model-1", "alias"} {
			exchange(t, ts, authorityOf(0), m)
		}
		n, text := seriesOf(t, ts)
		// The label budget's series are per namespace with model names: a
		// round whose new pool shares the namespace of the pool that stays
		// has fewer.
		counts = append(counts, n-strings.Count(text, "poolpicker_model_labels")-strings.Count(text, `limit="model_labels"`))
		for _, gone := range append(gonePools, gonePods...) {
			if strings.Contains(text, gone) {
				t.Fatalf("round %d: a series still names %s:\n%s", r, gone, text)
			}
		}
	}
	t.Logf("series after each round: %v", counts)
	// The new pools' namespaces come round every 5 rounds (poolNS), and
	// with them the staying namespace's share of the label budget: alone
	// (its own new pool) it borrows the whole budget, beside another it
	// gives back half. Round 1 has no pool removed yet and model names
	// under the cap; from the second round of the second cycle on, each
	// round has the series of the same round of the cycle before.
	for i := 6; i < len(counts); i++ {
		if counts[i] != counts[i-5] {
			t.Fatalf("series count grew under churn: %v", counts)
		}
	}
	_, text := seriesOf(t, ts)
	for _, want := range []string{`model_name="other"`, `model_name="alias"`, `target_model_name="served-model"`} {
		if !strings.Contains(text, want) {
			t.Errorf("no series with %s:\n%s", want, text)
		}
	}
	checkSeriesValid(t, ts)
}
