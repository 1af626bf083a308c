// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// The sample pools of config/samples/local.
var samplePools = []struct {
	host, pool, model string
	deploy            types.NamespacedName
}{
	{"chat.team-a.example", "team-a/chat", "meta-llama/Llama-3.1-8B-Instruct", types.NamespacedName{Namespace: "team-a", Name: "chat-vllm"}},
	{"lora.team-a.example", "team-a/lora", "sql-lora", types.NamespacedName{Namespace: "team-a", Name: "lora-vllm"}},
	{"code.team-b.example", "team-b/code", "Qwen/Qwen2.5-Coder-7B-Instruct", types.NamespacedName{Namespace: "team-b", Name: "code-vllm"}},
}

// Every sample pool's traffic lands on its own pods only, for JSON and SSE,
// completions and chat, with all three pools served by one picker process.
func TestEachPoolServedByItsOwnPods(t *testing.T) {
	before := map[string]modelsim.Stats{}
	for _, sp := range samplePools {
		for _, p := range stack.Pods(sp.deploy) {
			before[p.Server.Addr()] = p.Server.Stats()
		}
	}
	var wg sync.WaitGroup
	results := make([][]outcome, len(samplePools))
	for i, sp := range samplePools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 24 {
				body := completion(sp.model, fmt.Sprintf("request %d for %s", j, sp.pool), 4, j%2 == 1)
				path := "/v1/completions"
				if j%3 == 2 {
					body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi %d"}],"max_tokens":4,"stream":%v}`, sp.model, j, j%2 == 1)
					path = "/v1/chat/completions"
				}
				results[i] = append(results[i], send(context.Background(), sp.host, path, body, nil))
			}
		}()
	}
	wg.Wait()
	for i, sp := range samplePools {
		own := map[string]bool{}
		for _, p := range stack.Pods(sp.deploy) {
			own[p.Server.Addr()] = true
		}
		used := map[string]int{}
		for _, o := range results[i] {
			if !o.ok() || o.pool != sp.pool || !own[o.endpoint] {
				t.Fatalf("%s: %v (own pods %v)", sp.pool, o, own)
			}
			if strings.Contains(o.body, "data: ") && !strings.HasSuffix(o.body, "data: [DONE]\n\n") {
				t.Fatalf("%s: SSE stream cut: %q", sp.pool, o.body)
			}
			used[o.endpoint]++
		}
		t.Logf("%s: requests per pod %v", sp.pool, used)
	}
	// The servers agree: each served only its own pool's model.
	for _, sp := range samplePools {
		for _, p := range stack.Pods(sp.deploy) {
			after := p.Server.Stats()
			for m, n := range after.ByModel {
				if n > before[p.Server.Addr()].ByModel[m] && m != sp.model {
					t.Fatalf("%s pod %s served model %s", sp.pool, p.Name, m)
				}
			}
		}
	}
}

// A pool scaled up then down under steady traffic: no request fails, new
// pods take traffic, removed pods get none once the picker has seen them go.
func TestScaleUpAndDownUnderTraffic(t *testing.T) { scaleUpAndDownUnderTraffic(t, "scale") }

func scaleUpAndDownUnderTraffic(t *testing.T, name string) {
	p := newPool(t, name, 2, "--port=8000", "--time-per-output-token=5ms")
	l := startLoad(4, func(w, i int) (string, string) {
		return p.host, completion(modelsim.DefaultModel, fmt.Sprintf("w%d-%d", w, i), 8, i%2 == 0)
	})
	l.waitFor(t, 20)
	ctx := context.Background()
	if err := stack.Scale(ctx, p.deploy, 4); err != nil {
		t.Fatal(err)
	}
	pods := p.pods()
	eventually(t, "traffic on every pod", func() bool {
		for _, pod := range pods {
			if pod.Server.Stats().Requests == 0 {
				return false
			}
		}
		return true
	})
	if err := stack.Scale(ctx, p.deploy, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the picker down to 1 ready pod", func() bool {
		v, ok := pickerMetric(t, "inference_pool_ready_pods", p.key())
		return ok && v == 1
	})
	picksAfter := stack.Gateway.Stats().Picks
	l.waitFor(t, 30)
	out := l.stop()
	if bad := failures(out); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed during scaling, first: %v", len(bad), len(out), bad[0])
	}
	remaining := p.pods()[0].Server.Addr()
	picks := stack.Gateway.Stats().Picks
	for _, pod := range pods[1:] {
		a := pod.Server.Addr()
		if picks[a] != picksAfter[a] {
			t.Fatalf("removed pod %s picked %d times after the picker dropped it", a, picks[a]-picksAfter[a])
		}
	}
	t.Logf("%d requests, none failed; picks %v; remaining pod %s", len(out), picks, remaining)
}

// The pool's selector moves to another Deployment under traffic: no request
// fails, and traffic ends up on the new pods only.
func TestSelectorChangeUnderTraffic(t *testing.T) { selectorChangeUnderTraffic(t, "selector") }

func selectorChangeUnderTraffic(t *testing.T, name string) {
	p := newPool(t, name, 2, "--port=8000", "--time-per-output-token=5ms")
	addDeployment(t, p.ns, "selector-v2", 2, "--port=8000", "--time-per-output-token=5ms", "--name=v2")
	v2 := map[string]bool{}
	for _, pod := range stack.Pods(types.NamespacedName{Namespace: p.ns, Name: "selector-v2"}) {
		v2[pod.Server.Addr()] = true
	}
	l := startLoad(4, func(w, i int) (string, string) {
		return p.host, completion(modelsim.DefaultModel, fmt.Sprintf("w%d-%d", w, i), 8, i%2 == 1)
	})
	l.waitFor(t, 20)
	ctx := context.Background()
	var pool v1.InferencePool
	if err := stack.Env.Client.Get(ctx, p.key(), &pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "selector-v2"}
	if err := stack.Env.Client.Update(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	// Once a request lands on v2, every later one must too.
	eventually(t, "traffic on the new selector's pods", func() bool {
		out := l.snapshot()
		return len(out) > 0 && v2[out[len(out)-1].endpoint]
	})
	switched := time.Now()
	l.waitFor(t, 40)
	out := l.stop()
	if bad := failures(out); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed across the selector change, first: %v", len(bad), len(out), bad[0])
	}
	var late []outcome
	for _, o := range out {
		if o.at.After(switched.Add(time.Second)) && !v2[o.endpoint] {
			late = append(late, o)
		}
	}
	if len(late) > 0 {
		t.Fatalf("%d requests served by the old selector's pods after the switch, first: %v", len(late), late[0])
	}
	t.Logf("%d requests, none failed; switched %s after the update", len(out), switched.Sub(changed).Round(time.Millisecond))
}

// poolpicker restarted under traffic on every sample pool: the gateway holds
// and retries requests while it is down, no request is lost, and the gateway
// reports the outage.
func TestPickerRestartUnderTraffic(t *testing.T) {
	before := stack.Gateway.Stats()
	l := startLoad(6, func(w, i int) (string, string) {
		sp := samplePools[w%len(samplePools)]
		return sp.host, completion(sp.model, fmt.Sprintf("restart w%d-%d", w, i), 6, i%2 == 0)
	})
	l.waitFor(t, 20)
	start := time.Now()
	if err := stack.RestartPicker(context.Background()); err != nil {
		t.Fatal(err)
	}
	restart := time.Since(start)
	l.waitFor(t, 30)
	out := l.stop()
	// With replicas restarted one at a time the gateway fails over to the
	// other; an outage, if any, must have ended within the retry window.
	after, outages := nothingLost(t, "the restart", out, before)
	held := 0
	for _, o := range outages {
		held += o.Retried
	}
	retried := 0
	for _, o := range out {
		if o.attempts != "" {
			retried++
		}
	}
	t.Logf("rolling restart took %s; %d requests, none lost; gateway outages %d, %d requests held and retried (%d answers carry the attempts header); response phases passed through: %d",
		restart.Round(time.Millisecond), len(out), len(outages), held, retried, after.ResponsePhaseLost-before.ResponsePhaseLost)
}

// A model server killed without its pod going away: once its metrics are
// stale the picker stops choosing it, while its Pod stays Ready.
func TestKilledServerNotPickedAfterStaleness(t *testing.T) {
	killedServerNotPickedAfterStaleness(t, "kill")
}

func killedServerNotPickedAfterStaleness(t *testing.T, name string) {
	p := newPool(t, name, 3, "--port=8000", "--time-per-output-token=2ms")
	dead := p.pods()[0].Server
	deadAddr := dead.Addr()
	dead.Stop()
	killed := time.Now()
	l := startLoad(3, func(w, i int) (string, string) {
		return p.host, completion(modelsim.DefaultModel, fmt.Sprintf("kill w%d-%d", w, i), 4, false)
	})
	// The window: the staleness threshold plus one scrape timeout (1s) for
	// the failing scrape, with slack for a loaded machine.
	window := staleness + 2*time.Second
	deadline := killed.Add(window)
	eventually(t, "the staleness window", func() bool { return time.Now().After(deadline) })
	picks := stack.Gateway.Stats().Picks[deadAddr]
	l.waitFor(t, 60)
	out := l.stop()
	if bad := failures(out); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed (the gateway falls back on refused connections), first: %v", len(bad), len(out), bad[0])
	}
	if after := stack.Gateway.Stats().Picks[deadAddr]; after != picks {
		t.Fatalf("killed server %s picked %d times after the staleness window", deadAddr, after-picks)
	}
	t.Logf("%d requests after the kill, none failed, none picked %s after %s", len(out), deadAddr, window)
}

// Requests sharing a long prefix stick to the server that caches it, though
// the gateway spreads them over both picker replicas, each with its own
// prefix index: every replica sends a prefix it has not seen where the
// others do (rendezvous hashing of its leading blocks), so they all land on
// one server. The servers report the cached tokens.
func TestPrefixAffinity(t *testing.T) {
	sp := samplePools[0]
	prefix := strings.Repeat("You are a helpful assistant who answers about GPUs and caches. ", 64) // ~4 KiB
	per := map[string]int{}
	pickers := map[string]int{}
	cached := 0
	const n = 20
	for i := range n {
		o := send(context.Background(), sp.host, "/v1/completions", completion(sp.model, prefix+fmt.Sprintf("Question %d?", i), 2, false), nil)
		if !o.ok() {
			t.Fatalf("request %d: %v", i, o)
		}
		per[o.endpoint]++
		pickers[o.picker]++
		var r struct {
			Usage struct {
				Details struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(o.body), &r); err != nil {
			t.Fatal(err)
		}
		if r.Usage.Details.CachedTokens > 0 {
			cached++
		}
	}
	if len(pickers) != pickerReplicas {
		t.Fatalf("requests decided by pickers %v; want all %d replicas to have decided some", pickers, pickerReplicas)
	}
	if len(per) != 1 {
		t.Fatalf("shared-prefix requests through pickers %v spread over servers %v; want one server", pickers, per)
	}
	if cached < n-1 {
		t.Fatalf("only %d of %d requests found their prefix cached; want all but the first", cached, n)
	}
	t.Logf("shared-prefix requests per server %v, per picker %v; %d of %d hit the prefix cache", per, pickers, cached, n)
}

// Requests for a LoRA adapter go to the server that is running it rather
// than to servers equally loaded with base-model work.
func TestLoRAAffinity(t *testing.T) {
	sp := samplePools[1]
	pods := stack.Pods(sp.deploy)
	// The last pod: earlier tests sent adapter traffic to others, so only
	// the adapter it runs can draw these requests to it.
	holderIdx := len(pods) - 1
	holder := pods[holderIdx].Server
	// Equal load everywhere, straight to the servers (not through the
	// picker, so its in-flight counts stay equal): one long request each,
	// for adapter tweet-lora on the holder and the base model elsewhere.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i, p := range pods {
		model := "meta-llama/Llama-3.1-8B"
		if i == holderIdx {
			model = "tweet-lora"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p.Server.Addr()+"/v1/completions",
				strings.NewReader(completion(model, "a long background request", 4000, true)))
			if resp, err := client.Do(req); err == nil {
				drain(resp)
			}
		}()
	}
	eventually(t, "background requests running", func() bool {
		for _, p := range pods {
			if p.Server.State().Running != 1 {
				return false
			}
		}
		return true
	})
	// The picker's scrape shows one running request per server on average.
	eventually(t, "the picker seeing the load", func() bool {
		v, ok := pickerMetricMin(t, "inference_pool_average_running_requests", types.NamespacedName{Namespace: "team-a", Name: "lora"})
		return ok && v >= 1
	})
	per := map[string]int{}
	const n = 20
	for i := range n {
		o := send(context.Background(), sp.host, "/v1/completions", completion("tweet-lora", fmt.Sprintf("tweet number %d about %d things", i, i*7), 2, false), nil)
		if !o.ok() {
			t.Fatalf("request %d: %v", i, o)
		}
		per[o.endpoint]++
	}
	if per[holder.Addr()] < n*8/10 {
		t.Fatalf("tweet-lora requests %v; want at least 80%% on %s, which runs the adapter", per, holder.Addr())
	}
	t.Logf("tweet-lora requests per server %v (adapter running on %s)", per, holder.Addr())
}

// Under saturation (every server's KV cache over the threshold), sheddable
// requests (objective with negative priority) get 429 while critical and
// default ones are served.
func TestSheddableShedUnderSaturation(t *testing.T) {
	// A fill request holds its KV blocks (prompt and max_tokens) from
	// admission until it ends: 50 ms per token keeps it ~48 s, time for a
	// loaded machine to see it through every replica.
	p := newPool(t, "shed", 2, "--port=8000", "--num-gpu-blocks=64", "--block-size=16", "--max-num-seqs=4", "--time-per-output-token=50ms")
	// One objective in each group, named by each header: both steer.
	objectives := fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch, namespace: %[1]s}
spec: {priority: -1, poolRef: {name: shed}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: %[1]s}
spec: {priority: 10, poolRef: {name: shed}}
`, p.ns)
	if err := stack.Apply(context.Background(), []byte(objectives)); err != nil {
		t.Fatal(err)
	}
	batch := map[string]string{"x-llm-d-inference-objective": "batch"}
	critical := map[string]string{"x-gateway-inference-objective": "critical"}
	sheddable := func() outcome {
		return send(context.Background(), p.host, "/v1/completions", completion(modelsim.DefaultModel, "batch job", 2, false), batch)
	}
	// Not saturated: sheddable requests pass.
	eventually(t, "sheddable served while idle", func() bool { return sheddable().ok() })
	// Saturate: one request per server holding ~94% of its KV cache.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, pod := range p.pods() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+pod.Server.Addr()+"/v1/completions",
				strings.NewReader(completion(modelsim.DefaultModel, "fill", 950, true)))
			if resp, err := client.Do(req); err == nil {
				drain(resp)
			}
		}()
	}
	// Admission sheds when the endpoints' mean load in the replica's own
	// scrapes reaches 1 (the default pool-average rule; a server's load is
	// at least its KV use over 0.8), so an average KV use of 0.8 over a
	// replica's fresh endpoints is enough. A server's KV use jumps from ~0
	// to ~0.94 when its fill is admitted.
	eventually(t, "every replica seeing the pool saturated", func() bool {
		v, ok := pickerMetricMin(t, "inference_pool_average_kv_cache_utilization", p.key())
		return ok && v >= 0.8
	})
	// Each replica also needs the objective that makes the request
	// sheddable; replicas read InferenceObjectives on their own, so one may
	// still route a "batch" request at its default priority. Wait until
	// every replica has shed one (the gateway alternates them).
	shedBy := map[string]bool{}
	eventually(t, "every replica shedding sheddable requests", func() bool {
		o := sheddable()
		if o.code == http.StatusTooManyRequests {
			shedBy[o.picker] = true
		} else {
			// Kept in the log: what each replica's scrapes said then.
			kv := map[string]float64{}
			for _, r := range stack.Replicas() {
				kv[r.IP], _ = replicaMetric(t, r.MetricsAddr, "inference_pool_average_kv_cache_utilization", p.key())
			}
			t.Logf("sheddable request before every replica sheds: %v (picker %s; average KV use per replica %v)", o, o.picker, kv)
		}
		return len(shedBy) == len(stack.Replicas())
	})
	// From then on no replica serves one, and the others are still served.
	for range 2 * len(stack.Replicas()) {
		if shed := sheddable(); shed.code != http.StatusTooManyRequests || !strings.Contains(shed.body, `"code":429`) {
			t.Fatalf("sheddable request under saturation: %v (picker %s)", shed, shed.picker)
		}
	}
	for _, hdr := range []map[string]string{critical, nil} {
		if o := send(context.Background(), p.host, "/v1/completions", completion(modelsim.DefaultModel, "urgent", 2, false), hdr); !o.ok() {
			t.Fatalf("request with objective %v under saturation: %v", hdr, o)
		}
	}
	t.Logf("sheddable shed by replicas %v", shedBy)
}

// Malformed and impossible requests get their documented errors, from the
// picker (400, 413, 503), the model server (404) or the gateway (404).
func TestMalformedRequests(t *testing.T) {
	sp := samplePools[0]
	empty := newPool(t, "empty", 1, "--port=8000")
	if err := stack.Scale(context.Background(), empty.deploy, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the empty pool without pods", func() bool {
		v, ok := pickerMetric(t, "inference_pool_ready_pods", empty.key())
		return ok && v == 0
	})
	tests := []struct {
		name, host, path, body string
		wantCode               int
		wantMsg                string
	}{
		{"invalid JSON", sp.host, "/v1/completions", `{"model":`, 400, "invalid JSON"},
		{"no model", sp.host, "/v1/completions", `{"prompt":"hello"}`, 400, "model"},
		{"body over the picker's limit", sp.host, "/v1/completions", completion(sp.model, strings.Repeat("x", maxBodyBytes), 2, false), 413, "exceeds"},
		{"pool without endpoints", empty.host, "/v1/completions", completion(modelsim.DefaultModel, "x", 2, false), 503, ""},
		{"model the servers do not serve", sp.host, "/v1/completions", completion("no-such-model", "x", 2, false), 404, "does not exist"},
		{"no route", "nowhere.example", "/v1/completions", completion(sp.model, "x", 2, false), 404, "no HTTPRoute matches"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := send(context.Background(), tt.host, tt.path, tt.body, nil)
			if o.err != nil || o.code != tt.wantCode {
				t.Fatalf("got %v, want %d", o, tt.wantCode)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(o.body), &e); err != nil || e.Error.Code != tt.wantCode || !strings.Contains(e.Error.Message, tt.wantMsg) {
				t.Fatalf("error body %q (%v): want an OpenAI-style error with code %d mentioning %q", o.body, err, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

// The endpoint staleness tests again, with every replica watching each
// namespace's pods once for all its pools (--pod-watch-plan=namespace)
// instead of per pool (the default plan, for these one-pool namespaces):
// the same guarantees hold.
func TestStalenessUnderNamespaceWatchPlan(t *testing.T) {
	withPickerArgs(t, "--pod-watch-plan=namespace")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, pool string)
		pool string
	}{
		{"ScaleUpAndDownUnderTraffic", scaleUpAndDownUnderTraffic, "ns-scale"},
		{"SelectorChangeUnderTraffic", selectorChangeUnderTraffic, "ns-selector"},
		{"KilledServerNotPickedAfterStaleness", killedServerNotPickedAfterStaleness, "ns-kill"},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, tc.pool) })
	}
	// The plan was in force: each replica watched the tests' namespaces
	// whole since its restart.
	for _, r := range stack.Replicas() {
		logBytes, err := os.ReadFile(r.Process.Log)
		if err != nil {
			t.Fatal(err)
		}
		sinceStart := logBytes[bytes.LastIndex(logBytes, []byte("==== start")):]
		if n := bytes.Count(sinceStart, []byte("watching the namespace's pods once for all its pools")); n < 3 {
			t.Errorf("replica %s watched %d namespaces whole since its restart, want at least the tests' 3", r.Pod, n)
		}
	}
}
