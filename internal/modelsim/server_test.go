// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fast are options for tests that need no timing: no prefill or decode time.
func fast(o Options) Options {
	o.PrefillPerToken, o.DecodePerToken, o.LoRALoadLatency = -1, -1, -1
	return o
}

func TestCompletionsAndChat(t *testing.T) {
	s := startServer(t, fast(Options{Seed: 7}))
	c := newClient(t)
	base := "http://" + s.Addr()
	tests := []struct {
		name, path, body string
		wantObject       string
		wantTokens       int
		wantFinish       string
	}{
		{"completion", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"Say hello to the world","max_tokens":5}`, "text_completion", 5, "length"},
		{"completion token ids", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":[1,2,3,4,5,6],"max_tokens":3}`, "text_completion", 3, "length"},
		{"completion list of one prompt", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":["hi there"],"max_tokens":2,"temperature":0.3,"unknown":{"x":1}}`, "text_completion", 2, "length"},
		{"chat", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"hello"}],"max_completion_tokens":4}`, "chat.completion", 4, "length"},
		{"chat content parts", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":1}`, "chat.completion", 1, "length"},
		{"no limit stops by itself", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"tell me"}`, "text_completion", -1, "stop"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := post(t, c, base+tt.path, tt.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get(HeaderServer); got != s.Addr() {
				t.Fatalf("%s = %q, want %q", HeaderServer, got, s.Addr())
			}
			r := decode[wireResponse](t, body)
			if r.Object != tt.wantObject || r.Model != strings.Split(strings.Split(tt.body, `"model":"`)[1], `"`)[0] || len(r.Choices) != 1 {
				t.Fatalf("response %s", body)
			}
			text := r.Choices[0].Text
			if r.Choices[0].Message != nil {
				if r.Choices[0].Message.Role != "assistant" {
					t.Fatalf("message role %q", r.Choices[0].Message.Role)
				}
				text = r.Choices[0].Message.Content
			}
			words := len(strings.Fields(text))
			if r.Usage == nil || r.Usage.CompletionTokens != words || r.Usage.TotalTokens != r.Usage.PromptTokens+words || r.Usage.PromptTokens < 1 {
				t.Fatalf("usage %+v does not match %d words of %q", r.Usage, words, text)
			}
			if tt.wantTokens >= 0 && words != tt.wantTokens {
				t.Fatalf("%d tokens, want %d", words, tt.wantTokens)
			}
			if tt.wantTokens < 0 && (words < DefaultMaxTokens/2 || words > DefaultMaxTokens) {
				t.Fatalf("%d tokens without a limit, want %d..%d", words, DefaultMaxTokens/2, DefaultMaxTokens)
			}
			if f := r.Choices[0].FinishReason; f == nil || *f != tt.wantFinish {
				t.Fatalf("finish_reason %v, want %s", f, tt.wantFinish)
			}
		})
	}
	if st := s.Stats(); st.Completed != len(tests) || st.ByModel[DefaultModel] != len(tests) {
		t.Fatalf("stats %+v, want %d completed", st, len(tests))
	}
}

func TestStreaming(t *testing.T) {
	s := startServer(t, fast(Options{}))
	c := newClient(t)
	tests := []struct {
		name, path, body string
		wantUsage        bool
		chat             bool
	}{
		{"completion", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"abc def","max_tokens":4,"stream":true}`, true, false},
		{"chat", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"x"}],"max_tokens":4,"stream":true}`, true, true},
		{"usage turned off", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"abc def","max_tokens":4,"stream":true,"stream_options":{"include_usage":false}}`, false, false},
		{"usage asked for", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"x"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := post(t, c, "http://"+s.Addr()+tt.path, tt.body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events := sseEvents(t, body)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", events[len(events)-1])
			}
			var text strings.Builder
			var usageEvents int
			finishes := 0
			for i, e := range events[:len(events)-1] {
				r := decode[wireResponse](t, []byte(e))
				if r.Usage != nil {
					usageEvents++
					if i != len(events)-2 || len(r.Choices) != 0 {
						t.Fatalf("usage in event %d of %d with %d choices; want only in the last before [DONE]", i, len(events), len(r.Choices))
					}
					if r.Usage.CompletionTokens != 4 {
						t.Fatalf("usage %+v, want 4 completion tokens", r.Usage)
					}
					continue
				}
				ch := r.Choices[0]
				if tt.chat {
					if i == 0 && (ch.Delta == nil || ch.Delta.Role != "assistant") {
						t.Fatalf("first chat chunk %s has no assistant role", e)
					}
					text.WriteString(ch.Delta.Content)
				} else {
					text.WriteString(ch.Text)
				}
				if ch.FinishReason != nil {
					finishes++
				}
			}
			if got := len(strings.Fields(text.String())); got != 4 {
				t.Fatalf("streamed %q: %d tokens, want 4", text.String(), got)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.wantUsage]; usageEvents != want {
				t.Fatalf("%d usage events, want %d", usageEvents, want)
			}
			if finishes != 1 {
				t.Fatalf("%d chunks with finish_reason, want 1", finishes)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	s := startServer(t, fast(Options{MaxModelLenTokens: 64, LoRAAdapters: []string{"sql-lora"}}))
	c := newClient(t)
	base := "http://" + s.Addr()
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantMsg                  string
	}{
		{"bad json", "POST", "/v1/completions", `{"model":`, 400, "invalid JSON body"},
		{"trailing data", "POST", "/v1/completions", `{"model":"m","prompt":"x"} {}`, 400, "trailing data"},
		{"missing model", "POST", "/v1/completions", `{"prompt":"x"}`, 400, `"model" field is required`},
		{"missing prompt", "POST", "/v1/completions", `{"model":"` + DefaultModel + `"}`, 400, `"prompt" field is required`},
		{"two prompts", "POST", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":["a","b"]}`, 400, "one prompt per request"},
		{"bad prompt type", "POST", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":{"a":1}}`, 400, `"prompt" must be`},
		{"empty prompt", "POST", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":""}`, 400, "prompt is empty"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[]}`, 400, `"messages" field is required`},
		{"message without role", "POST", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"content":"x"}]}`, 400, `messages[0]: the "role" field`},
		{"bad content", "POST", "/v1/chat/completions", `{"model":"` + DefaultModel + `","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content"},
		{"zero max_tokens", "POST", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"x","max_tokens":0}`, 400, "max_tokens must be at least 1"},
		{"too long", "POST", "/v1/completions", `{"model":"` + DefaultModel + `","prompt":"` + strings.Repeat("x", 200) + `","max_tokens":30}`, 400, "maximum context length is 64 tokens"},
		{"unknown model", "POST", "/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "The model `nope` does not exist."},
		{"wrong method", "GET", "/v1/completions", ``, 405, "use POST"},
		{"unknown path", "GET", "/v2/things", ``, 404, "no route GET /v2/things"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantCode, body)
			}
			e := decode[errorBody](t, body)
			if e.Error.Code != tt.wantCode || !strings.Contains(e.Error.Message, tt.wantMsg) {
				t.Fatalf("error %+v, want code %d and message containing %q", e.Error, tt.wantCode, tt.wantMsg)
			}
		})
	}
	if st := s.Stats(); st.Requests != 0 {
		t.Fatalf("%d requests admitted, want none", st.Requests)
	}
}

func TestModelsAndHealth(t *testing.T) {
	s := startServer(t, fast(Options{Model: "base", LoRAAdapters: []string{"a1", "a2"}}))
	c := newClient(t)
	resp, err := c.Get("http://" + s.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	l := decode[modelList](t, body)
	var ids []string
	for _, m := range l.Data {
		ids = append(ids, m.ID)
		if m.ID != "base" && (m.Parent == nil || *m.Parent != "base") {
			t.Fatalf("adapter %s without parent base", m.ID)
		}
	}
	if strings.Join(ids, ",") != "base,a1,a2" {
		t.Fatalf("models %v", ids)
	}
	resp, err = c.Get("http://" + s.Addr() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestDeterministicWithSeed(t *testing.T) {
	a := startServer(t, fast(Options{Seed: 42}))
	b := startServer(t, fast(Options{Seed: 42}))
	d := startServer(t, fast(Options{Seed: 43}))
	c := newClient(t)
	text := func(s *Server, prompt string) string {
		_, body := post(t, c, "http://"+s.Addr()+"/v1/completions", `{"model":"`+DefaultModel+`","prompt":"`+prompt+`","max_tokens":12}`)
		return decode[wireResponse](t, body).Choices[0].Text
	}
	if x, y := text(a, "p1"), text(b, "p1"); x != y {
		t.Fatalf("same seed and prompt gave %q and %q", x, y)
	}
	if x, y := text(a, "p1"), text(d, "p1"); x == y {
		t.Fatalf("different seeds gave the same text %q", x)
	}
	if x, y := text(a, "p1"), text(a, "p2"); x == y {
		t.Fatalf("different prompts gave the same text %q", x)
	}
}

// metricsOf scrapes the server's page with the Prometheus text parser.
func metricsOf(t *testing.T, c *http.Client, s *Server) (map[string]*familyView, int) {
	t.Helper()
	resp, err := c.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]*familyView{}
	for name, f := range fams {
		v := &familyView{}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			val := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			v.samples = append(v.samples, sample{labels, val})
		}
		out[name] = v
	}
	return out, len(body)
}

type familyView struct{ samples []sample }

type sample struct {
	labels map[string]string
	value  float64
}

func (f *familyView) gauge(t *testing.T) float64 {
	t.Helper()
	if f == nil || len(f.samples) == 0 {
		t.Fatal("family missing")
	}
	return f.samples[0].value
}

// newest is the LoRA info series with the largest value.
func (f *familyView) newest() sample {
	var best sample
	for _, s := range f.samples {
		if s.value >= best.value {
			best = s
		}
	}
	return best
}

// streamStart opens a streaming request and returns once its first token
// arrived (so it is running), with a func that ends it.
func streamStart(t *testing.T, c *http.Client, s *Server, model string) (cancel func()) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	body := fmt.Sprintf(`{"model":%q,"prompt":"hold %s","max_tokens":1000,"stream":true}`, model, model)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	return func() { cancelCtx(); resp.Body.Close() }
}

func TestQueueingAndMetrics(t *testing.T) {
	s := startServer(t, Options{MaxNumSeqs: 2, DecodePerToken: 5 * time.Millisecond, PrefillPerToken: -1, NumGPUBlocks: 1000, BlockSizeTokens: 16})
	c := newClient(t)
	fams, size := metricsOf(t, c, s)
	if size < DefaultMetricsPageBytes {
		t.Fatalf("/metrics is %d bytes, want at least %d like a real vLLM page", size, DefaultMetricsPageBytes)
	}
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} {
		if fams[name] == nil {
			t.Fatalf("/metrics lacks %s", name)
		}
	}
	if _, ok := fams["vllm:lora_requests_info"]; ok {
		t.Fatalf("a server without adapters reports vllm:lora_requests_info")
	}
	cc := fams["vllm:cache_config_info"].samples[0].labels
	if cc["block_size"] != "16" || cc["num_gpu_blocks"] != "1000" {
		t.Fatalf("cache_config_info labels %v", cc)
	}

	stop1 := streamStart(t, c, s, DefaultModel)
	stop2 := streamStart(t, c, s, DefaultModel)
	// A third request waits: both sequence slots are taken.
	third := make(chan error, 1)
	go func() {
		resp, err := c.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+DefaultModel+`","prompt":"third","max_tokens":2}`))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		third <- err
	}()
	eventually(t, "third request queued", func() bool { return s.State().Waiting == 1 })
	fams, _ = metricsOf(t, c, s)
	if w, r := fams["vllm:num_requests_waiting"].gauge(t), fams["vllm:num_requests_running"].gauge(t); w != 1 || r != 2 {
		t.Fatalf("waiting %v running %v, want 1 and 2", w, r)
	}
	// Each holds ceil((tokens+1000)/16) blocks.
	if kv := fams["vllm:kv_cache_usage_perc"].gauge(t); kv <= 0.1 || kv > 0.2 {
		t.Fatalf("kv_cache_usage_perc %v, want two requests' share (~0.13)", kv)
	}
	stop1()
	if err := <-third; err != nil {
		t.Fatalf("third request: %v", err)
	}
	stop2()
	eventually(t, "server idle", func() bool { st := s.State(); return st.Running == 0 && st.Waiting == 0 })
	if st := s.State(); st.KVCacheUsage != 0 {
		t.Fatalf("KV usage %v with nothing running", st.KVCacheUsage)
	}
	if st := s.Stats(); st.PeakRunning != 2 || st.PeakWaiting < 1 || st.Completed != 1 || st.Cancelled != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPrefixCacheCutsTimeToFirstToken(t *testing.T) {
	// 1,000 prompt tokens at 1ms each: 1s to prefill uncached.
	s := startServer(t, Options{PrefillPerToken: time.Millisecond, DecodePerToken: -1, BlockSizeTokens: 16})
	c := newClient(t)
	ttft := func(prompt string) (time.Duration, int) {
		start := time.Now()
		resp, err := c.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+DefaultModel+`","prompt":"`+prompt+`","max_tokens":2,"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		first := time.Since(start)
		rest, _ := io.ReadAll(r)
		events := sseEvents(t, rest)
		u := decode[wireResponse](t, []byte(events[len(events)-2])).Usage
		return first, u.PromptTokensDetails.CachedTokens
	}
	shared := strings.Repeat("abcd", 960)
	cold, cachedCold := ttft(shared + strings.Repeat("x", 160))
	warm, cachedWarm := ttft(shared + strings.Repeat("y", 160))
	if cachedCold != 0 || cachedWarm != 960 {
		t.Fatalf("cached tokens %d then %d, want 0 then 960 (the shared 60 blocks)", cachedCold, cachedWarm)
	}
	// Cold prefills 1,000 tokens, warm 40: the warm TTFT is far shorter.
	if warm*4 > cold {
		t.Fatalf("TTFT cold %v, warm %v: the cached prefix did not cut it", cold, warm)
	}
	if st := s.Stats(); st.CachedPromptTokens != 960 {
		t.Fatalf("stats %+v", st)
	}
	// The page counts both prompts' tokens as queried and the second's
	// shared blocks as hits, as vLLM's prefix-cache counters do.
	fams, _ := metricsOf(t, c, s)
	queries, hits := fams["vllm:prefix_cache_queries_total"], fams["vllm:prefix_cache_hits_total"]
	if q, h := queries.gauge(t), hits.gauge(t); q != 2000 || h != 960 {
		t.Fatalf("prefix_cache_queries_total %v, hits_total %v, want 2000 and 960", q, h)
	}
	for _, f := range []*familyView{queries, hits} {
		for _, other := range f.samples[1:] {
			if other.value != 0 {
				t.Fatalf("a padding label set reports %v prefix-cache tokens, want 0 (the server's are on the first)", other.value)
			}
		}
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	s := startServer(t, fast(Options{DisablePrefixCaching: true}))
	c := newClient(t)
	body := `{"model":"` + DefaultModel + `","prompt":"` + strings.Repeat("abcd", 100) + `","max_tokens":1}`
	post(t, c, "http://"+s.Addr()+"/v1/completions", body)
	_, b := post(t, c, "http://"+s.Addr()+"/v1/completions", body)
	if got := decode[wireResponse](t, b).Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("cached tokens %d with prefix caching off", got)
	}
}

func TestLoRASlots(t *testing.T) {
	s := startServer(t, Options{Model: "base", LoRAAdapters: []string{"a", "b", "c"}, MaxLoRAs: 1,
		DecodePerToken: 5 * time.Millisecond, PrefillPerToken: -1, LoRALoadLatency: -1})
	c := newClient(t)
	stopA := streamStart(t, c, s, "a")
	fams, _ := metricsOf(t, c, s)
	info := fams["vllm:lora_requests_info"].newest()
	if info.labels["running_lora_adapters"] != "a" || info.labels["waiting_lora_adapters"] != "" || info.labels["max_lora"] != "1" {
		t.Fatalf("lora info %v", info.labels)
	}
	// b waits: its adapter needs the only slot, held by a running request.
	bDone := make(chan string, 1)
	go func() {
		resp, err := c.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"b","prompt":"for b","max_tokens":1}`))
		if err != nil {
			bDone <- err.Error()
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		bDone <- resp.Status
	}()
	eventually(t, "b queued", func() bool { return s.State().Waiting == 1 })
	// The base model needs no slot and passes the waiting adapter.
	_, body := post(t, c, "http://"+s.Addr()+"/v1/completions", `{"model":"base","prompt":"x","max_tokens":1}`)
	if r := decode[wireResponse](t, body); r.Model != "base" {
		t.Fatalf("base request: %s", body)
	}
	fams, _ = metricsOf(t, c, s)
	info = fams["vllm:lora_requests_info"].newest()
	if info.labels["running_lora_adapters"] != "a" || info.labels["waiting_lora_adapters"] != "b" {
		t.Fatalf("lora info %v, want a running, b waiting", info.labels)
	}
	stopA()
	if got := <-bDone; got != "200 OK" {
		t.Fatalf("b: %s", got)
	}
	if got := s.LoadedAdapters(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("loaded adapters %v, want [b]", got)
	}
	if st := s.Stats(); st.AdapterLoads != 2 || st.ByModel["a"] != 1 || st.ByModel["b"] != 1 || st.ByModel["base"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoadSlowsSteps(t *testing.T) {
	s, err := New(Options{LoadSlowdown: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	g := newGeneration(1, "m", []byte("p"), 1, true, 0)
	tests := []struct {
		running int
		want    time.Duration
	}{{0, 10 * time.Millisecond}, {1, 10 * time.Millisecond}, {2, 15 * time.Millisecond}, {5, 30 * time.Millisecond}}
	for _, tt := range tests {
		s.eng.mu.Lock()
		s.eng.running = tt.running
		s.eng.mu.Unlock()
		if got := s.stepTime(10*time.Millisecond, g); got != tt.want {
			t.Fatalf("%d running: step %v, want %v", tt.running, got, tt.want)
		}
	}
	j := newGeneration(1, "m", []byte("p"), 1, true, 0.1)
	for range 100 {
		if f := j.factor(); f < 0.9 || f > 1.1 {
			t.Fatalf("jitter factor %v outside ±10%%", f)
		}
	}
}

func TestStopCutsConnections(t *testing.T) {
	s := startServer(t, Options{DecodePerToken: 5 * time.Millisecond, PrefillPerToken: -1})
	c := newClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions",
		strings.NewReader(`{"model":"`+DefaultModel+`","prompt":"x","max_tokens":5000,"stream":true}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	s.Stop()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("stream ended cleanly after Stop; want a cut connection")
	}
	if _, err := c.Get("http://" + s.Addr() + "/health"); err == nil {
		t.Fatalf("server answers after Stop")
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}

func TestStartStopByContext(t *testing.T) {
	s, err := New(Options{Addr: "127.0.0.9:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	cancel()
	<-s.Done()
	// A bad address is a clear error.
	occupied, _ := New(Options{Addr: "256.0.0.1:1"})
	if err := occupied.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listen on 256.0.0.1:1") {
		t.Fatalf("bad address: %v", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"duplicate adapter", Options{LoRAAdapters: []string{"a", "a"}}, `adapter "a" listed twice`},
		{"adapter equals base", Options{Model: "m", LoRAAdapters: []string{"m"}}, `adapter "m" listed twice or equal to the base model`},
		{"empty adapter", Options{LoRAAdapters: []string{""}}, "empty LoRA adapter name"},
		{"jitter", Options{Jitter: 1}, "jitter 1 outside [0, 1)"},
		{"context too long", Options{NumGPUBlocks: 10, BlockSizeTokens: 16, MaxModelLenTokens: 161}, "does not fit in the KV cache"},
		{"negative time scale", Options{TimeScale: -1}, "time scale -1 outside"},
		{"huge time scale", Options{TimeScale: 1e9}, "time scale 1e+09 outside"},
		{"negative prefill overhead", Options{PrefillOverhead: -time.Millisecond}, "negative prefill overhead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"x"}`, `{"model":"m","prompt":[1,2]}`, `{"model":"m","prompt":["a"]}`,
		`{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"t"}]}]}`,
		`{"model":"m","max_tokens":-1,"prompt":"x"}`, `{`, `null`, `[]`, `{"model":1}`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := parseRequest(body, chat, 16)
		if (p == nil) == (err == nil) {
			t.Fatalf("parseRequest(%q) = %v, %v: want exactly one", body, p, err)
		}
		if err != nil && (err.code != 400 || err.msg == "") {
			t.Fatalf("error %+v", err)
		}
		if p != nil && (p.promptTokens < 1 || p.maxTokens < 1 || p.model == "") {
			t.Fatalf("accepted invalid request %+v", p)
		}
	})
}

func TestTimeScaleDividesSimulatedDurations(t *testing.T) {
	// Simulated: 400ms of prefill overhead, 100 uncached tokens at 1ms, and
	// 19 decode steps of 50ms: 1.45s. At a time scale of 10 it takes 145ms.
	const simulated = 1450 * time.Millisecond
	took := func(scale float64) time.Duration {
		s := startServer(t, Options{PrefillOverhead: 400 * time.Millisecond, PrefillPerToken: time.Millisecond,
			DecodePerToken: 50 * time.Millisecond, LoadSlowdown: -1, TimeScale: scale})
		c := newClient(t)
		start := time.Now()
		post(t, c, "http://"+s.Addr()+"/v1/completions", `{"model":"`+DefaultModel+`","prompt":"`+strings.Repeat("abcd", 100)+`","max_tokens":20}`)
		return time.Since(start)
	}
	unscaled, scaled := took(1), took(10)
	// Timers never fire early, so each simulated time is a floor. A busy
	// machine delays both runs alike, so the scaled run is held to the
	// unscaled one measured beside it rather than to a wall-clock ceiling.
	if unscaled < simulated || scaled < simulated/10 {
		t.Fatalf("unscaled run took %v, scaled %v: below the simulated %v and %v", unscaled, scaled, simulated, simulated/10)
	}
	if scaled > unscaled/2 {
		t.Fatalf("at time scale 10 the request took %v, unscaled %v: want at most half", scaled, unscaled)
	}
}
