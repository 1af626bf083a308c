// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLLMDArgs checks the fleet's parameters as the llm-d simulator's
// flags: costs divided by the time scale, the load factor of a full batch.
func TestLLMDArgs(t *testing.T) {
	c := defaultSweep()
	c.timeScale = 2
	args := llmdArgs(&c, 0, 8123, 7)
	flag := func(name string) string {
		i := slices.Index(args, name)
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("no %s in %v", name, args)
		}
		return args[i+1]
	}
	want := map[string]string{
		"--port": "8123", "--max-num-seqs": "4", "--kv-cache-size": "450", "--block-size": "16",
		"--prefill-overhead": "15ms", "--prefill-time-per-token": "500µs", "--inter-token-latency": "10ms",
		"--time-factor-under-load": "1.15", "--latency-calculator": "per-token", "--seed": "7",
	}
	for k, v := range want {
		if got := flag(k); got != v {
			t.Errorf("%s %s, want %s", k, got, v)
		}
	}
	if !slices.Contains(args, "--enable-kvcache=true") || !slices.Contains(args, "--force-dummy-tokenizer=true") {
		t.Errorf("prefix cache or dummy tokenizer not enabled: %v", args)
	}
}

func TestCheckSim(t *testing.T) {
	cases := []struct {
		sim, bin, err string
	}{
		{simModelsim, "", ""},
		{simLLMD, "", "needs -llmd-sim-bin"},
		{simLLMD, "/nonexistent/llm-d-inference-sim", "-llmd-sim-bin"},
		{"vllm", "", `-sim "vllm"`},
	}
	for _, c := range cases {
		err := checkSim(c.sim, c.bin)
		if (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("checkSim(%q, %q) = %v, want %q", c.sim, c.bin, err, c.err)
		}
	}
}

// TestLLMDSweep runs one short point on the llm-d simulator, when
// LLMD_SIM_BIN names its binary (built from its public source; the
// performance page says how): every request served through one
// poolpicker replica and two, usage read back, and prefix affinity far
// above round robin's.
func TestLLMDSweep(t *testing.T) {
	bin := os.Getenv("LLMD_SIM_BIN")
	if bin == "" {
		t.Skip("LLMD_SIM_BIN not set")
	}
	c := quickSweep()
	c.sim, c.llmdBin, c.requests, c.timeScale = simLLMD, bin, 100, 1
	rs, err := runPoint(context.Background(), &c, 12, 0.5, false)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]result{}
	for _, r := range rs {
		if r.failed > 0 || r.served == 0 {
			t.Fatalf("%s: %d failed, %d served: %s", r.series(), r.failed, r.served, r.firstFailure)
		}
		by[r.series()] = r
		t.Logf("%s: hit %.3f, TTFT p50 %v p90 %v", r.series(), r.hitRate, r.ttft50, r.ttft90)
	}
	if pp, rr := by["poolpicker"], by["round-robin"]; pp.hitRate < rr.hitRate+0.2 {
		t.Errorf("poolpicker hit rate %.3f, round-robin %.3f", pp.hitRate, rr.hitRate)
	}
}

// TestLLMDPreciseLoRA runs poolpicker's precise configuration on the llm-d
// simulator with LoRA adapters loaded (every request names an adapter),
// when LLMD_SIM_BIN names its binary: the simulator's render endpoints
// refuse an adapter's name, so the prompts are rendered for the base model
// (tokenizer.modelName, which the harness sets as llm-d's token producer
// is given it) and keyed under the adapter, as the simulator keys the
// adapter's blocks. Every pick is tokenized (no fallback to the learned
// index), the event index predicts cached tokens, and the servers confirm
// at least 0.98 of them: the keys are the events'.
func TestLLMDPreciseLoRA(t *testing.T) {
	bin := os.Getenv("LLMD_SIM_BIN")
	if bin == "" {
		t.Skip("LLMD_SIM_BIN not set")
	}
	precise, err := routerFromConfig(preciseRouterName+"="+filepath.Join("configs", "precise.yaml"), false)
	if err != nil {
		t.Fatal(err)
	}
	c := defaultSweep()
	c.sim, c.llmdBin, c.requests, c.timeScale, c.parallel = simLLMD, bin, 80, 1, false
	c.loraAdapters, c.maxLoRAs, c.ordinaryWords = 3, 2, true
	c.routers, c.replicas = []router{precise}, []int{1}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	rs, err := runPoint(context.Background(), &c, 6, 0.3, false)
	if err != nil {
		t.Fatal(err)
	}
	assertPreciseRoutedFromEvents(t, rs[0], "the adapters' keys")
}

// assertPreciseRoutedFromEvents holds a precise router's run to every
// request served, every pick tokenized and the servers confirming at least
// 0.98 of what its event index predicted; keys names whose keys would
// match none of the events when it predicted nothing.
func assertPreciseRoutedFromEvents(t *testing.T, r result, keys string) {
	t.Helper()
	if r.failed > 0 || r.served == 0 {
		t.Fatalf("%d failed, %d served: %s", r.failed, r.served, r.firstFailure)
	}
	t.Logf("hit %.3f, events predicted %d confirmed %d, %d untokenized", r.hitRate, r.eventPredicted, r.eventConfirmed, r.fallbacks)
	if r.fallbacks != 0 {
		t.Errorf("%d picks scored without the prompt's tokens, want none", r.fallbacks)
	}
	if r.eventPredicted == 0 {
		t.Fatalf("the event index predicted no cached tokens: %s match none of the events'", keys)
	}
	if got := float64(r.eventConfirmed) / float64(r.eventPredicted); got < 0.98 {
		t.Errorf("servers confirmed %.3f of the event index's predicted tokens, want at least 0.98", got)
	}
}
