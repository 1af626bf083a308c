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

// sharedPicker is a picker (the scheduler of preciseConfig, its ext_proc
// over gRPC) of pools of one namespace, each selecting the servers ps:
// send routes a completion through the named pool's picker service and
// forwards it to the endpoint picked.
type sharedPicker struct {
	reg  *datastore.Registry
	prom *prometheus.Registry
	send func(pool string, body []byte)
	port int
}

func newSharedPicker(t *testing.T, ps *preciseServers, pools ...string) *sharedPicker {
	t.Helper()
	sp := &sharedPicker{reg: datastore.NewRegistry(), prom: prometheus.NewRegistry(), port: ps.httpPort}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sched, err := scheduling.New(nil, scheduling.Options{ConfigText: fmt.Sprintf(preciseConfig, ps.pubPort, ps.replayPort),
		Registerer: sp.prom, BaseContext: func() context.Context { return ctx }})
	if err != nil {
		t.Fatal(err)
	}
	sp.reg.AddObserver(sched)
	for _, name := range pools {
		sp.addPool(name, ps.ips)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extproc.New(sp.reg, sched, extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis, Registerer: prometheus.NewRegistry()})
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
	sp.send = func(pool string, body []byte) {
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
	return sp
}

// addPool adds the pool ns/name of the pods at ips, picked for by the
// service epp-name.
func (sp *sharedPicker) addPool(name string, ips []string) {
	pool := sp.reg.Upsert(types.NamespacedName{Namespace: "ns", Name: name}, &datastore.PoolSpec{Selector: map[string]string{"app": "m"},
		TargetPorts: []int32{int32(sp.port)}, PickerService: "epp-" + name, PickerPort: 9002})
	sp.setPods(name, ips)
	pool.SetSynced(true)
}

// setPods makes the pool's endpoints the pods at ips, fresh and lightly
// loaded.
func (sp *sharedPicker) setPods(pool string, ips []string) {
	p, _ := sp.reg.Get(types.NamespacedName{Namespace: "ns", Name: pool})
	var srcs []datastore.EndpointSource
	for i, ip := range ips {
		srcs = append(srcs, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}, UID: types.UID(fmt.Sprint(i)), IP: ip})
	}
	p.SetPods(srcs)
	for _, e := range p.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
	}
}

// blocks is what the pool's event indexes hold.
func (sp *sharedPicker) blocks(pool string) float64 {
	return promtest.PoolSum(sp.prom, kvevents.MetricBlocks, "ns", pool)
}

func (sp *sharedPicker) subscriptions() float64 {
	return promtest.Value(sp.prom, kvevents.MetricLLMDActive, nil)
}

// stillFollowed checks that pool's picks of a new, repeated prefix are
// predicted from the server's events.
func (sp *sharedPicker) stillFollowed(t *testing.T, pool string) {
	t.Helper()
	before := sp.blocks(pool)
	sp.send(pool, completionBody("after round 0", 40))
	if !eventually(10*time.Second, func() bool { return sp.blocks(pool) >= before+40 }) {
		t.Fatalf("%s's event index holds %v blocks, %v before a new prompt of 40: its events stopped", pool, sp.blocks(pool), before)
	}
	predicted := func() float64 {
		return promtest.Value(sp.prom, prefix.MetricPredictedTokens, map[string]string{"plugin": "precise-prefix-cache-scorer"})
	}
	p0 := predicted()
	sp.send(pool, completionBody("after round 1", 40))
	// The server's report reaches the scorer after the client has the
	// answer.
	eventually(10*time.Second, func() bool { return predicted()-p0 >= 39*16 })
	if got := predicted() - p0; got < 39*16 {
		t.Errorf("the repeated prefix's pick was predicted %v cached tokens from the events, want at least %d", got, 39*16)
	}
}

// TestPreciseSharedEndpoint: two pools of one namespace whose selectors
// share a model server each follow its KV events with an event index of
// their own, charged to their own account; when one pool is removed, its
// blocks are released and the other pool's subscription goes on: its picks
// are still predicted from the server's events.
func TestPreciseSharedEndpoint(t *testing.T) {
	sp := newSharedPicker(t, newPreciseServers(t, []string{"127.0.94.2"}), "pool-a", "pool-b")
	// Both pools follow the server: a prompt sent through pool-b is in
	// both pools' event indexes, each counted (and charged) to its pool.
	sp.send("pool-b", completionBody("shared before round 0", 40))
	if !eventually(10*time.Second, func() bool { return sp.blocks("pool-a") >= 40 && sp.blocks("pool-b") >= 40 }) {
		t.Errorf("event-index blocks: pool-a %v, pool-b %v; want each pool's index to hold the server's 40 blocks, on its own account",
			sp.blocks("pool-a"), sp.blocks("pool-b"))
	}
	if got := sp.subscriptions(); got != 2 {
		t.Errorf("%v subscriptions, want one per pool of the shared endpoint (2)", got)
	}
	// pool-a goes; its blocks are released, pool-b's subscription stays.
	sp.reg.Remove(types.NamespacedName{Namespace: "ns", Name: "pool-a"})
	if got := sp.blocks("pool-a"); got != 0 {
		t.Errorf("a removed pool's event index still holds %v blocks", got)
	}
	if got := sp.subscriptions(); got != 1 {
		t.Errorf("%v subscriptions after pool-a left, want pool-b's (1)", got)
	}
	sp.stillFollowed(t, "pool-b")
}

// TestPreciseEndpointMovesBetweenPools: a server that pool-b selects
// before pool-a lets it go (a relabel: pool-b's watch hears first) is
// followed by pool-b after pool-a dropped it.
func TestPreciseEndpointMovesBetweenPools(t *testing.T) {
	ps := newPreciseServers(t, []string{"127.0.95.2"})
	sp := newSharedPicker(t, ps, "pool-a")
	sp.addPool("pool-b", nil)
	sp.send("pool-a", completionBody("moving before round 0", 40))
	if !eventually(10*time.Second, func() bool { return sp.blocks("pool-a") >= 40 }) {
		t.Fatalf("pool-a's event index holds %v blocks, want the server's 40", sp.blocks("pool-a"))
	}
	sp.setPods("pool-b", ps.ips)
	sp.setPods("pool-a", nil)
	if got := sp.blocks("pool-a"); got != 0 {
		t.Errorf("pool-a's event index still holds %v blocks of an endpoint it let go", got)
	}
	sp.stillFollowed(t, "pool-b")
}
