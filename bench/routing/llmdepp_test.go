// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"sigs.k8s.io/yaml"
)

func TestRewriteTopicPort(t *testing.T) {
	cases := []struct{ in, want string }{
		{"kv@127.0.21.2:41234@sim-model", "kv@127.0.21.2:8000@sim-model"},
		{"kv@127.0.21.2:41234@org/model@v2", "kv@127.0.21.2:8000@org/model@v2"},
		{"kv@::1:41234@m", "kv@::1:41234@m"}, // not host:port: as it is
		{"kv@[::1]:41234@m", "kv@[::1]:8000@m"},
		{"other@127.0.0.1:1@m", "other@127.0.0.1:1@m"},
		{"kv@127.0.0.1:1", "kv@127.0.0.1:1"},
		{"", ""},
	}
	for _, c := range cases {
		if got := string(rewriteTopicPort([]byte(c.in), 8000)); got != c.want {
			t.Errorf("rewriteTopicPort(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestKVRelay sends a KV-event batch through a relay of two pickers over
// real ZMQ sockets on loopback, as a simulator (a dialing PUB) sends it to
// the pickers (each a binding SUB): each picker gets it, the topic naming
// the pool's target port, the sequence number and the payload as sent.
func TestKVRelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := startKVRelay(ctx, 8000, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.stop()
	got := make(chan zmq4.Msg, 2)
	for _, e := range r.eppEndpoints {
		picker := zmq4.NewSub(ctx)
		defer picker.Close()
		if err := picker.Listen(e); err != nil {
			t.Fatal(err)
		}
		if err := picker.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
			t.Fatal(err)
		}
		go func() {
			m, err := picker.Recv()
			if err == nil {
				got <- m
			}
		}()
	}
	server := zmq4.NewPub(ctx)
	defer server.Close()
	if err := server.Dial(r.serverEndpoint); err != nil {
		t.Fatal(err)
	}
	// A PUB drops what it sends before the subscriptions reach it, and
	// nothing signals that they did: send until both arrive.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for received := 0; received < 2; {
		if err := server.Send(zmq4.NewMsgFrom([]byte("kv@127.0.21.2:41234@sim-model"), []byte{0, 0, 0, 0, 0, 0, 0, 7}, []byte("batch"))); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if len(m.Frames) != 3 || string(m.Frames[0]) != "kv@127.0.21.2:8000@sim-model" || m.Frames[1][7] != 7 || string(m.Frames[2]) != "batch" {
				t.Fatalf("relayed %q", m.Frames)
			}
			received++
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%d of 2 pickers got a batch within 30s", received)
		}
	}
}

// TestLLMDPreciseConfig checks the precise configuration is YAML naming
// the fleet's render endpoint, its KV events' endpoint, block size and
// hash seed.
func TestLLMDPreciseConfig(t *testing.T) {
	text := llmdPreciseConfig("sim-model", "http://127.0.0.1:9", "tcp://127.0.0.1:7", 16)
	var cfg struct {
		Plugins []struct {
			Type       string         `json:"type"`
			Parameters map[string]any `json:"parameters"`
		} `json:"plugins"`
	}
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatal(err)
	}
	found := map[string]map[string]any{}
	for _, p := range cfg.Plugins {
		found[p.Type] = p.Parameters
	}
	tp, ok := found["precise-prefix-cache-producer"]["tokenProcessorConfig"].(map[string]any)
	if !ok || tp["blockSize"] != float64(16) || tp["hashSeed"] != llmdHashSeed {
		t.Errorf("tokenProcessorConfig %v", tp)
	}
	kv, _ := found["precise-prefix-cache-producer"]["kvEventsConfig"].(map[string]any)
	if kv["zmqEndpoint"] != "tcp://127.0.0.1:7" || kv["discoverPods"] != false {
		t.Errorf("kvEventsConfig %v", kv)
	}
	if v, _ := found["token-producer"]["vllm"].(map[string]any); v["url"] != "http://127.0.0.1:9" {
		t.Errorf("token-producer %v", found["token-producer"])
	}
}

// TestLLMDEPP runs a short point through llm-d's EPP (its default and its
// precise configuration) on the llm-d simulator, when LLMD_SIM_BIN and
// LLMD_EPP_BIN name their binaries (built from their public source;
// NOTES.md says how) and the control plane is there: every request is
// served, and each router hits the caches on a workload of few prefixes.
func TestLLMDEPP(t *testing.T) {
	sim, epp := os.Getenv("LLMD_SIM_BIN"), os.Getenv("LLMD_EPP_BIN")
	if sim == "" || epp == "" {
		t.Skip("LLMD_SIM_BIN or LLMD_EPP_BIN not set")
	}
	llmdBinary = epp
	if why := llmdEPP.missing(); why != "" {
		t.Skipf("llm-d: %s", why)
	}
	t.Cleanup(stopControlPlane)
	c := defaultSweep()
	c.sim, c.llmdBin, c.requests, c.timeScale, c.parallel = simLLMD, sim, 80, 0.5, false
	c.routers = []router{llmdRouter, llmdPreciseRouter}
	c.replicas = []int{1}
	rs, err := runPoint(context.Background(), &c, 2, 0.3, false)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	printResults(&out, rs, true)
	t.Logf("G=2 load=30%%:\n%s", out.String())
	for _, r := range rs {
		if r.failed > 0 || r.served == 0 {
			t.Fatalf("%s: %d failed, %d served: %s", r.series(), r.failed, r.served, r.firstFailure)
		}
		if r.hitRate < 0.6 {
			t.Errorf("%s: hit rate %.3f, want at least 0.6", r.series(), r.hitRate)
		}
	}
}

// TestFleetShapes checks the sweep's unequal servers, LoRA mix and
// ordinary-words prompts: each server's flags, the fleet's capacity, the
// models the requests name and the prompts' words, and the checks of the
// flags.
func TestFleetShapes(t *testing.T) {
	c := defaultSweep()
	c.serverSlots, c.serverKVBlocks = []int{8, 4, 2, 4}, []int{900, 450, 225, 450}
	c.loraAdapters, c.maxLoRAs, c.ordinaryWords = 3, 2, true
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	equal := defaultSweep()
	if got, want := c.capacity(), equal.capacity()*18/16; got < want*0.999 || got > want*1.001 {
		t.Errorf("capacity %.2f, want %.2f (18 slots against 16)", got, want)
	}
	args := llmdArgs(&c, 2, 8123, 7)
	flag := func(name string) string {
		i := slices.Index(args, name)
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("no %s in %v", name, args)
		}
		return args[i+1]
	}
	if flag("--max-num-seqs") != "2" || flag("--kv-cache-size") != "225" || flag("--max-loras") != "2" || !strings.Contains(flag("--lora-modules"), `"name":"adapter-0"`) {
		t.Errorf("server 2's flags %v", args)
	}
	for i, r := range workload(&c, 6, 0.5)[:50] {
		var body struct {
			Model, Prompt string
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("adapter-%d", r.group%3); body.Model != want {
			t.Fatalf("request %d of group %d names %q, want %q", i, r.group, body.Model, want)
		}
		if n := len(strings.Fields(body.Prompt)); n < c.prefixTokens+c.suffixTokens-10 || n > c.prefixTokens+c.suffixTokens+10 {
			t.Fatalf("request %d: %d words, want about %d", i, n, c.prefixTokens+c.suffixTokens)
		}
	}

	for _, bad := range []func(*sweepConfig){
		func(c *sweepConfig) { c.serverSlots = []int{8, 4} },
		func(c *sweepConfig) { c.serverKVBlocks = []int{900, 450, 225, 50} }, // a request does not fit in 50 blocks
		func(c *sweepConfig) { c.loraAdapters, c.maxLoRAs = 2, 3 },
	} {
		b := c
		bad(&b)
		if err := b.check(); err == nil {
			t.Errorf("check passed %+v", b)
		}
	}
}
