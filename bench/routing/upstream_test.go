// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// TestUpstreamPrefix checks the reference's approximate prefix cache as the
// stand-in scores it: the matched share of the prompt's blocks of the
// server's block size, and an LRU of the server's block count that loses a
// prompt from its first block.
func TestUpstreamPrefix(t *testing.T) {
	reg := datastore.NewRegistry()
	pool := reg.Upsert(types.NamespacedName{Namespace: "ns", Name: "pool"}, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}})
	pool.SetPods([]datastore.EndpointSource{
		{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, UID: "a", IP: "127.0.9.1"},
		{Pod: types.NamespacedName{Namespace: "ns", Name: "b"}, UID: "b", IP: "127.0.9.2"},
	})
	pool.SetSynced(true)
	eps := pool.Endpoints().Endpoints
	for _, e := range eps {
		// Blocks of 8 tokens (32 characters); 10 of them per server.
		e.SetMetrics(&datastore.Metrics{BlockSize: 8, NumBlocks: 10, ScrapedAt: time.Now()})
	}
	p, err := newUpstreamPrefix("prefix", nil, framework.NewHandle(t.Context(), logr.Discard(), nil))
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*upstreamPrefix)
	prompt := func(tag string, blocks int) []byte { return []byte(strings.Repeat(fmt.Sprintf("%-31s|", tag), blocks)) }
	score := func(pr []byte, record *datastore.Endpoint) []float64 {
		cs := framework.NewCycleState(pool, framework.Saturation{}, func() uint64 { return 1 })
		cs.TargetModel = "m"
		var c []framework.Candidate
		for i, e := range eps {
			c = append(c, framework.Candidate{Endpoint: framework.EndpointOf(e), Metrics: framework.MetricsOf(e.Metrics()), Index: i})
		}
		scores := make([]float64, len(c))
		s.Score(context.Background(), cs, &framework.Request{Prompt: pr}, c, scores)
		if record != nil {
			s.PostPick(context.Background(), cs, &framework.Request{Prompt: pr}, &framework.Result{Endpoints: []framework.Endpoint{framework.EndpointOf(record)}})
		}
		return scores
	}
	x := prompt("x", 8)
	if got := score(x, eps[0]); got[0] != 0 || got[1] != 0 {
		t.Fatalf("first sight: %v", got)
	}
	half := append(append([]byte{}, x[:4*32]...), prompt("y", 4)...)
	if got := score(half, nil); got[0] != 0.5 || got[1] != 0 {
		t.Fatalf("a prompt sharing 4 of 8 blocks with what a holds: %v, want [0.5 0]", got)
	}
	// Four new blocks on a (10 held) evict x's first two: nothing of x
	// matches from its start any more.
	score(prompt("z", 4), eps[0])
	if got := score(x, nil); got[0] != 0 {
		t.Fatalf("x after its first blocks were evicted: %v, want 0 on a", got)
	}
}
