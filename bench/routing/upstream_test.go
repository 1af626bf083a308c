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

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

// TestUpstreamPrefix checks the reference's approximate prefix cache as the
// stand-in scores it: the matched share of the prompt's blocks of the
// server's block size, and an LRU of the server's block count that loses a
// prompt from its first block.
func TestUpstreamPrefix(t *testing.T) {
	// Blocks of 8 tokens (32 characters); 10 of them per server.
	eps := []*frameworktest.Endpoint{frameworktest.NewEndpoint("127.0.9.1:8000", nil), frameworktest.NewEndpoint("127.0.9.2:8000", nil)}
	for _, e := range eps {
		e.SetScrape(&framework.Scrape{BlockSize: 8, NumBlocks: 10, ScrapedAt: time.Now()})
	}
	pool := frameworktest.NewPool("ns", "pool", eps...)
	p, err := newUpstreamPrefix("prefix", nil, framework.NewHandle(t.Context(), logr.Discard(), nil))
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*upstreamPrefix)
	prompt := func(tag string, blocks int) []byte { return []byte(strings.Repeat(fmt.Sprintf("%-31s|", tag), blocks)) }
	score := func(pr []byte, record *frameworktest.Endpoint) []float64 {
		cs := frameworktest.NewCycle(pool, "m", 1)
		scores, _ := frameworktest.Score(t, s, cs, &framework.Request{Prompt: pr}, frameworktest.Candidates(cs))
		if record != nil {
			s.PostPick(context.Background(), cs, &framework.Request{Prompt: pr}, &framework.Result{Endpoints: []framework.Endpoint{record}})
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
