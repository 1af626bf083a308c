// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/scheduling"
)

// TestRendezvousBalancesCache sends 12 new prefixes, one request each and
// one after the other, through the real ext_proc server to 4 real modelsim
// servers, with rendezvousBalanceCache on: every pool is idle at each pick,
// so the load slack admits every server, and the rendezvous hash alone
// would put the prefixes where the servers' addresses (a random port)
// send them, 5 or more on one server in 6 fleets of 10. With the balance,
// no server is chosen while it holds more than a prompt beyond the one
// that holds the least, so none gets more than 4 (and the least at least
// 2). Three fleets, so that the hash alone would fail it in most runs.
func TestRendezvousBalancesCache(t *testing.T) {
	cfg := strings.Replace(scheduling.DefaultConfigText, "    rendezvousLoadSlack: 8\n", "    rendezvousLoadSlack: 8\n    rendezvousBalanceCache: true\n", 1)
	if cfg == scheduling.DefaultConfigText {
		t.Fatal("the default config has no rendezvousLoadSlack: 8 line to add to")
	}
	c := defaultSweep()
	c.servers, c.slots, c.kvBlocks, c.blockTokens = 4, 4, 450, 16
	c.prefixTokens, c.suffixTokens, c.outputTokens = 1500, 8, 2
	c.timeScale = 50
	const groups = 12
	prompt := func(g int) []byte {
		prefix := words(rand.New(rand.NewPCG(1, uint64(g)+1)), fmt.Sprintf("system prompt %d: ", g), c.prefixTokens*modelsim.BytesPerToken)
		suffix := words(rand.New(rand.NewPCG(2, uint64(g))), fmt.Sprintf(" question %d: ", g), c.suffixTokens*modelsim.BytesPerToken)
		return fmt.Appendf(nil, `{"model":%q,"prompt":"%s%s","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
			modelsim.DefaultModel, prefix, suffix, c.outputTokens)
	}
	for n := range 3 {
		ctx := context.Background()
		f, err := startFleet(ctx, 40+n, &c, router{config: cfg}, 1)
		if err != nil {
			t.Fatal(err)
		}
		for g := range groups {
			out, err := f.send(ctx, time.Now(), fmt.Sprintf("req-%d", g), objectiveCritical, prompt(g))
			if err != nil || out.status != 200 {
				f.stop()
				t.Fatalf("fleet %d, request %d: status %d, %v", n, g, out.status, err)
			}
		}
		var served []int
		for _, s := range f.servers {
			served = append(served, s.(simServer).Stats().Completed)
		}
		f.stop()
		if slices.Max(served) > 4 || slices.Min(served) < 2 {
			t.Errorf("fleet %d: prefixes per server %v, want from 2 to 4 each", n, served)
		}
	}
}
