// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

func TestMain(m *testing.M) {
	// zmq4's PUB socket (the KV-event relay's, and the test's simulated
	// server's) does not stop its writer goroutine on Close (v0.17.0:
	// pubSocket.Close leaves pubMWriter.run waiting).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

func TestWorkloadIsSeededAndShaped(t *testing.T) {
	c := defaultSweep()
	c.requests = 400
	a, b := workload(&c, 12, 0.8), workload(&c, 12, 0.8)
	groups := map[int]int{}
	for i := range a {
		if !bytes.Equal(a[i].body, b[i].body) || a[i].at != b[i].at {
			t.Fatalf("request %d differs between two workloads of one seed", i)
		}
		if !json.Valid(a[i].body) {
			t.Fatalf("request %d: invalid JSON %s", i, a[i].body)
		}
		groups[a[i].group]++
	}
	if len(groups) != 12 {
		t.Fatalf("%d groups used, want 12", len(groups))
	}
	// Poisson arrivals at 80 % of capacity: the mean gap is within 15 %.
	mean := a[len(a)-1].at / time.Duration(len(a))
	want := time.Duration(float64(time.Second) / (0.8 * c.capacity()))
	if mean < want*85/100 || mean > want*115/100 {
		t.Fatalf("mean inter-arrival %v, want about %v", mean, want)
	}
	// Two requests of one group share their prefix, not their suffix.
	var x, y []byte
	for _, r := range a {
		if r.group == 3 {
			if x == nil {
				x = r.body
			} else if y == nil {
				y = r.body
			}
		}
	}
	common := 0
	for common < min(len(x), len(y)) && x[common] == y[common] {
		common++
	}
	if prefix := c.prefixTokens * 4; common < prefix || common >= len(x)-10 {
		t.Fatalf("two requests of a group share %d bytes; the prefix is %d of %d", common, prefix, len(x))
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-groups", "6,x"}, `-groups: "x" is not a positive number`},
		{[]string{"-loads", "0"}, `-loads: "0" is not a positive number`},
		{[]string{"-routers", "poolpicker,fastest"}, `unknown router "fastest"`},
		{[]string{"-time-scale", "0"}, "-time-scale 0"},
		{[]string{"-requests", "5"}, "-requests 5"},
		{[]string{"-kv-blocks", "50"}, "does not fit in 50 KV blocks"},
		{[]string{"-replicas", "1,0"}, `-replicas: "0" is not a positive number`},
		{[]string{"-replicas", "17"}, "-replicas 17: at most 16"},
		{[]string{"-runs", "0"}, "-runs 0: between 1 and 99"},
		{[]string{"-conversations", "-1"}, "-conversations -1"},
		{[]string{"-kv-event-batch", "0"}, "-kv-event-batch 0"},
		{[]string{"-precise-replicas", "2,17"}, "-precise-replicas: 17: at most 16"},
		{[]string{"-spread", "hash"}, `want round-robin or random, got "hash"`},
		{[]string{"-prompt-bytes-per-token", "65"}, "-prompt-bytes-per-token 65: between 0 and 64"},
		{[]string{"-router-config", "balance"}, `want NAME=FILE, got "balance"`},
		{[]string{"-peer-sync-router-config", "balance="}, `want NAME=FILE, got "balance="`},
		{[]string{"-peer-sync-router-config", "balance=" + filepath.Join("testdata", "missing.yaml")}, "missing.yaml"},
	} {
		var stdout, stderr bytes.Buffer
		if code := mainCode(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestPlotAndTable(t *testing.T) {
	rs := []result{
		{groups: 6, load: 0.5, router: "poolpicker", ttft50: 90 * time.Millisecond, hitRate: 0.96},
		{groups: 6, load: 0.5, router: "round-robin", ttft50: time.Second, hitRate: 0.7},
		{groups: 6, load: 0.8, router: "poolpicker", ttft50: 2 * time.Second, hitRate: 0.9},
		{groups: 6, load: 0.8, router: "round-robin", ttft50: 30 * time.Second, hitRate: 0.7},
	}
	svg := plot(rs, []int{6}, allRouters[:2])
	// Two routers on each of four rows (TTFT, hit rate, critical TTFT, shed).
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 8 || !strings.Contains(svg, "round-robin") {
		t.Fatalf("svg:\n%s", svg)
	}
	md := markdownTable(rs)
	if strings.Count(md, "\n") != 6 || !strings.Contains(md, "| 6 | 80% |") {
		t.Fatalf("table:\n%s", md)
	}

	// Results written by -json, in two pieces (by load), come back whole
	// and in order with -from-json.
	dir := t.TempDir()
	var files []string
	for i, piece := range [][]result{rs[2:], rs[:2]} {
		b, err := json.Marshal(exported(piece))
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, fmt.Sprintf("piece%d.json", i))
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	mdFile := filepath.Join(dir, "table.md")
	var stdout, stderr bytes.Buffer
	if code := mainCode([]string{"-from-json", strings.Join(files, ","), "-markdown", mdFile}, &stdout, &stderr); code != 0 {
		t.Fatalf("-from-json: exit %d: %s", code, stderr.String())
	}
	if got, err := os.ReadFile(mdFile); err != nil || string(got) != md {
		t.Fatalf("table from JSON (%v):\n%s\nwant:\n%s", err, got, md)
	}
	if code := mainCode([]string{"-from-json", filepath.Join(dir, "missing.json")}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "-from-json:") {
		t.Fatalf("missing file: exit %d, stderr %q", code, stderr.String())
	}
}

// TestSpread checks how streams are spread over replicas: in turn, or at
// random (seeded) over all of them.
func TestSpread(t *testing.T) {
	for _, mode := range []spreadMode{spreadRoundRobin, spreadRandom} {
		t.Run(string(mode), func(t *testing.T) {
			f := &fleet{spread: mode, rand: seeded(1)}
			for range 3 {
				// Never dialled: a client connects on first use.
				c := eppclient.New("127.0.0.1:1", eppclient.Options{})
				defer c.Close()
				f.replicas = append(f.replicas, &replica{client: c})
			}
			counts := map[*replica]int{}
			var order []*replica
			for range 300 {
				c := f.nextReplica()
				counts[c]++
				order = append(order, c)
			}
			for i, r := range f.replicas {
				if n := counts[r]; n < 70 || n > 130 {
					t.Fatalf("replica %d got %d of 300 streams", i, n)
				}
			}
			inTurn := true
			for i := range order {
				inTurn = inTurn && order[i] == f.replicas[i%3]
			}
			if inTurn != (mode == spreadRoundRobin) {
				t.Fatalf("streams in turn: %v", inTurn)
			}
		})
	}
}

// TestCounterAgingConfig keeps the poolpicker-counter-aging router the
// default profile with only the prefix scorer's serverCounterAging on.
func TestCounterAgingConfig(t *testing.T) {
	params := func(text string) map[string]any {
		t.Helper()
		cfg, err := scheduling.LoadConfig([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range cfg.Plugins {
			if p.Type == prefix.Type {
				var m map[string]any
				if err := json.Unmarshal(p.Parameters, &m); err != nil {
					t.Fatal(err)
				}
				return m
			}
		}
		t.Fatal("no prefix-cache-scorer in the config")
		return nil
	}
	def, aging := params(scheduling.DefaultConfigText), params(counterAgingConfig)
	if aging["serverCounterAging"] != true {
		t.Fatalf("poolpicker-counter-aging's prefix parameters %v: serverCounterAging is not true", aging)
	}
	delete(aging, "serverCounterAging")
	if !reflect.DeepEqual(def, aging) {
		t.Fatalf("poolpicker-counter-aging's other prefix parameters %v, the default profile's %v", aging, def)
	}
}

func TestRouterFromConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(scheduling.DefaultConfigText), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: no-such-plugin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value    string
		peerSync bool
		wantErr  string
	}{
		{value: "balance=" + file},
		{value: "balance=" + file, peerSync: true},
		{value: "balance=" + bad, wantErr: "no-such-plugin"},
	} {
		r, err := routerFromConfig(tc.value, tc.peerSync)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want one naming %q", tc.value, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.value, err)
		}
		if r.name != "balance" || r.config != scheduling.DefaultConfigText || r.peerSync != tc.peerSync || r.external != nil || r.flowControl {
			t.Errorf("%s (peer sync %v): got %+v", tc.value, tc.peerSync, r)
		}
	}
}

// TestConversationWorkload: with -conversations each request is the next
// turn of one conversation: its prompt is the conversation's last prompt,
// that turn's answer and a new question, all on one of the G system
// prompts; the same seed gives the same requests.
func TestConversationWorkload(t *testing.T) {
	c := defaultSweep()
	c.requests, c.conversations, c.ordinaryWords = 200, 16, true
	a, b := workload(&c, 4, 0.5), workload(&c, 4, 0.5)
	prompt := func(r request) string {
		var body struct {
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatal(err)
		}
		return body.Prompt
	}
	systems := map[string]int{}
	extended := 0
	for i := range a {
		if !bytes.Equal(a[i].body, b[i].body) {
			t.Fatalf("request %d differs between two workloads of one seed", i)
		}
		p := prompt(a[i])
		systems[p[:strings.Index(p, ":")]]++
		if !strings.HasPrefix(p, fmt.Sprintf("system prompt %d: ", a[i].group)) {
			t.Fatalf("request %d of group %d starts %.30q", i, a[i].group, p)
		}
		// The conversation's previous turn, if any, is a prefix of this one.
		for j := i - 1; j >= 0; j-- {
			if q := prompt(a[j]); strings.HasPrefix(p, q) {
				if !strings.Contains(p[len(q):], " answer: ") {
					t.Fatalf("request %d extends request %d without its answer", i, j)
				}
				extended++
				break
			}
		}
	}
	if len(systems) != 4 {
		t.Fatalf("%d system prompts used, want 4", len(systems))
	}
	// Every request but each conversation's first continues one.
	if extended < len(a)-16 {
		t.Fatalf("%d of %d requests continue a conversation, want at least %d", extended, len(a), len(a)-16)
	}
}

// TestWithKVEvents: the precise scorer of a config is given the relay's
// endpoint (bound, no pod discovery) and the servers' replay port; the
// rest of the config is as written, and it still loads.
func TestWithKVEvents(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("configs", "precise.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := routerFromConfig(preciseRouterName+"="+filepath.Join("configs", "precise.yaml"), false)
	if err != nil || !r.kvEvents {
		t.Fatalf("router of the precise config: %+v, %v; want one reading KV events", r, err)
	}
	if r, _ := routerFromConfig("def="+writeTemp(t, scheduling.DefaultConfigText), false); r.kvEvents {
		t.Fatal("the default profile's router reads KV events")
	}
	got, err := withKVEvents(string(text), "tcp://127.0.0.1:7001", 7002)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := scheduling.LoadConfig([]byte(got))
	if err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	orig, _ := scheduling.LoadConfig(text)
	if len(cfg.Plugins) != len(orig.Plugins) || !reflect.DeepEqual(cfg.SchedulingProfiles, orig.SchedulingProfiles) {
		t.Fatalf("plugins or profiles changed:\n%s", got)
	}
	for _, p := range cfg.Plugins {
		if p.Type != prefix.PreciseType {
			continue
		}
		var params prefix.PreciseParams
		if err := json.Unmarshal(p.Parameters, &params); err != nil {
			t.Fatal(err)
		}
		kv := params.KVEventsConfig
		if kv == nil || kv.ZMQEndpoint != "tcp://127.0.0.1:7001" || kv.DiscoverPods == nil || *kv.DiscoverPods || kv.PodDiscoveryConfig == nil || kv.PodDiscoveryConfig.ReplaySocketPort != 7002 {
			t.Fatalf("kvEventsConfig %+v", kv)
		}
		if params.Tokenizer == nil || params.Tokenizer.ModelName != modelsim.DefaultModel {
			t.Fatalf("tokenizer %+v: want the servers' base model to render for", params.Tokenizer)
		}
		if params.TokenProcessorConfig == nil || params.TokenProcessorConfig.HashSeed != llmdHashSeed || params.TokenProcessorConfig.BlockSize != 16 {
			t.Fatalf("tokenProcessorConfig %+v: want the servers' block size and hash seed", params.TokenProcessorConfig)
		}
		return
	}
	t.Fatalf("no %s in\n%s", prefix.PreciseType, got)
}

func writeTemp(t *testing.T, text string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestMediansAndBestRatios: a point's figures over three runs are each
// figure's median, the counts summed; the others are compared with the
// lower TTFT and the higher hit rate of llm-d's two routers.
func TestMediansAndBestRatios(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	run := func(p50, p90, p99 int, hit float64, failed int) []result {
		return []result{
			{router: "poolpicker", ttft50: ms(p50)[0], ttft90: ms(p90)[0], ttft99: ms(p99)[0], hitRate: hit, failed: failed, predicted: 100, confirmed: 90},
			{router: llmdRouterName, ttft50: 100 * time.Millisecond, ttft90: 400 * time.Millisecond, ttft99: 900 * time.Millisecond, hitRate: 0.8},
			{router: llmdPreciseRouterName, ttft50: 200 * time.Millisecond, ttft90: 300 * time.Millisecond, ttft99: 1000 * time.Millisecond, hitRate: 0.9},
		}
	}
	m := medians([][]result{run(50, 600, 900, 0.7, 1), run(200, 300, 700, 0.95, 0), run(100, 330, 800, 0.85, 2)})
	p := m[0]
	if p.ttft50 != ms(100)[0] || p.ttft90 != ms(330)[0] || p.ttft99 != ms(800)[0] || p.hitRate != 0.85 || p.failed != 3 || p.predicted != 300 || p.confirmed != 270 {
		t.Fatalf("medians %+v", p)
	}
	if even := median(ms(1, 4, 2, 3)); even != ms(2)[0]+ms(1)[0]/2 {
		t.Fatalf("median of 1,2,3,4 ms = %v", even)
	}
	var out bytes.Buffer
	printBestRatios(&out, m)
	want := "poolpicker against the better llm-d: TTFT p50 1.00×, p90 1.10×, p99 0.89×; hit rate -0.050"
	if !strings.Contains(out.String(), want) || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("ratios:\n%s\nwant the one line %q", out.String(), want)
	}
}

// TestPrecisePeerSyncRouter: -precise-peer-sync's router is poolpicker-precise's
// config with peer sync, run with its numbers of replicas above 1.
func TestPrecisePeerSyncRouter(t *testing.T) {
	precise, err := routerFromConfig(preciseRouterName+"="+filepath.Join("configs", "precise.yaml"), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		own, replicas, want []int
	}{
		{own: []int{1, 2, 3}, replicas: []int{1}, want: []int{2, 3}},
		{replicas: []int{1, 2}, want: []int{2}},
	} {
		p := precise
		p.replicas = tc.own
		r := precisePeerSync(p, tc.replicas)
		if r.name != precisePeerSyncRouterName || !r.peerSync || !r.kvEvents || r.config != precise.config || !reflect.DeepEqual(r.replicas, tc.want) {
			t.Errorf("own %v, -replicas %v: %+v, want peer sync and replicas %v", tc.own, tc.replicas, r, tc.want)
		}
		if !reflect.DeepEqual(p.replicas, tc.own) {
			t.Errorf("the precise router's replicas changed to %v", p.replicas)
		}
	}
}
