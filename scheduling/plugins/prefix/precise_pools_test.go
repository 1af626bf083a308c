// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/kvevents"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// eventually reports whether cond held within d, checked as the events
// it waits for arrive (every few milliseconds).
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// TestPreciseSharedEndpoint: two pools of one namespace whose selectors
// share a model server each follow its KV events with an event index of
// their own, charged to their own account; when one pool is removed, its
// blocks are released and the other pool's subscription goes on: its picks
// are still predicted from the server's events.
func TestPreciseSharedEndpoint(t *testing.T) {
	ps := newPreciseServers(t, []string{"127.0.94.2"})
	prom := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sched, err := scheduling.New(nil, scheduling.Options{ConfigText: fmt.Sprintf(preciseConfig, ps.pubPort, ps.replayPort),
		Registerer: prom, BaseContext: func() context.Context { return ctx }})
	if err != nil {
		t.Fatal(err)
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(sched)
	keyA := types.NamespacedName{Namespace: "ns", Name: "pool-a"}
	keyB := types.NamespacedName{Namespace: "ns", Name: "pool-b"}
	for _, key := range []types.NamespacedName{keyA, keyB} {
		pool := reg.Upsert(key, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{int32(ps.httpPort)},
			PickerService: "epp-" + key.Name, PickerPort: 9002})
		pool.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "ns", Name: "pod-0"}, UID: "0", IP: ps.ips[0]}})
		pool.SetSynced(true)
		for _, e := range pool.Endpoints().Endpoints {
			e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extproc.New(reg, sched, extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	client := eppclient.New(lis.Addr().String(), eppclient.Options{})
	t.Cleanup(func() { _ = client.Close() })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	httpc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	send := func(pool string, body []byte) {
		t.Helper()
		_, err := client.Do(context.Background(), eppclient.Request{Authority: "epp-" + pool + ".ns.svc:9002", Body: body, Chunks: 2,
			Forward: func(ctx context.Context, res *eppclient.Result) (*eppclient.Response, error) {
				resp, err := httpc.Post("http://"+res.Endpoints()[0]+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return &eppclient.Response{Status: resp.StatusCode, Body: b, ServedPrimary: true}, err
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	blocks := func(pool string) float64 { return promtest.PoolSum(prom, kvevents.MetricBlocks, "ns", pool) }
	predicted := func() float64 {
		return promtest.Value(prom, prefix.MetricPredictedTokens, map[string]string{"plugin": "precise-prefix-cache-scorer"})
	}
	const wait = 10 * time.Second

	// Both pools follow the server: a prompt sent through pool-b is in
	// both pools' event indexes, each counted (and charged) to its pool.
	send("pool-b", completionBody("shared before round 0", 40))
	if !eventually(wait, func() bool { return blocks("pool-a") >= 40 && blocks("pool-b") >= 40 }) {
		t.Errorf("event-index blocks: pool-a %v, pool-b %v; want each pool's index to hold the server's 40 blocks, on its own account",
			blocks("pool-a"), blocks("pool-b"))
	}
	if got := promtest.Value(prom, kvevents.MetricLLMDActive, nil); got != 2 {
		t.Errorf("%v subscriptions, want one per pool of the shared endpoint (2)", got)
	}

	// pool-a goes; its blocks are released, pool-b's subscription stays.
	reg.Remove(keyA)
	if got := blocks("pool-a"); got != 0 {
		t.Errorf("a removed pool's event index still holds %v blocks", got)
	}
	if got := promtest.Value(prom, kvevents.MetricLLMDActive, nil); got != 1 {
		t.Errorf("%v subscriptions after pool-a left, want pool-b's (1)", got)
	}
	before := blocks("pool-b")
	send("pool-b", completionBody("shared after round 0", 40))
	if !eventually(wait, func() bool { return blocks("pool-b") >= before+40 }) {
		t.Fatalf("pool-b's event index holds %v blocks, %v before a new prompt of 40: its events stopped with pool-a", blocks("pool-b"), before)
	}
	p0 := predicted()
	send("pool-b", completionBody("shared after round 1", 40))
	if got := predicted() - p0; got < 39*16 {
		t.Errorf("the repeated prefix's pick was predicted %v cached tokens from the events, want at least %d", got, 39*16)
	}
}
