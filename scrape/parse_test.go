// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// namesOf returns the engine's families with the overrides applied.
func namesOf(t testing.TB, e Engine, o MetricNameOverrides) MetricNames {
	t.Helper()
	n, err := e.Names(o)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustPage(t testing.TB, s vllmpage.State, o vllmpage.Options) []byte {
	t.Helper()
	page, err := vllmpage.Page(s, o)
	if err != nil {
		t.Fatal(err)
	}
	return page
}

var richState = vllmpage.State{
	Waiting: 7, Running: 12, KVCacheUsage: 0.8125,
	RunningAdapters: []string{"sql-lora", "food-review"}, WaitingAdapters: []string{"tweet-summary"},
	MaxLoRA: 4, BlockSize: 16, NumGPUBlocks: 8192, ServedRequests: 4321,
	PrefixCacheQueries: 1234567, PrefixCacheHits: 456789,
}

func TestParseGeneratedPages(t *testing.T) {
	tests := []struct {
		name string
		eng  Engine
		opts vllmpage.Options
		want datastore.Metrics
	}{
		{"vllm", "vllm", vllmpage.Options{Engine: vllmpage.VLLM}, datastore.Metrics{
			WaitingRequests: 7, RunningRequests: 12, KVCacheUsage: 0.8125,
			RunningAdapters: []string{"sql-lora", "food-review"}, WaitingAdapters: []string{"tweet-summary"},
			MaxAdapters: 4, BlockSize: 16, NumBlocks: 8192, PrefixCacheQueries: 1234567, PrefixCacheHits: 456789}},
		{"vllm older kv name", "vllm", vllmpage.Options{Engine: vllmpage.VLLM, LegacyKVCacheName: true}, datastore.Metrics{
			WaitingRequests: 7, RunningRequests: 12, KVCacheUsage: 0.8125,
			RunningAdapters: []string{"sql-lora", "food-review"}, WaitingAdapters: []string{"tweet-summary"},
			MaxAdapters: 4, BlockSize: 16, NumBlocks: 8192, PrefixCacheQueries: 1234567, PrefixCacheHits: 456789}},
		{"vllm 200KB page", "vllm", vllmpage.Options{Engine: vllmpage.VLLM, MinBytes: 200 << 10}, datastore.Metrics{
			WaitingRequests: 7, RunningRequests: 12, KVCacheUsage: 0.8125,
			RunningAdapters: []string{"sql-lora", "food-review"}, WaitingAdapters: []string{"tweet-summary"},
			MaxAdapters: 4, BlockSize: 16, NumBlocks: 8192, PrefixCacheQueries: 1234567, PrefixCacheHits: 456789}},
		{"sglang", "sglang", vllmpage.Options{Engine: vllmpage.SGLang}, datastore.Metrics{
			WaitingRequests: 7, RunningRequests: 12, KVCacheUsage: 0.8125, BlockSize: 16, NumBlocks: 8192}},
		{"trtllm", "trtllm", vllmpage.Options{Engine: vllmpage.TRTLLM}, datastore.Metrics{
			WaitingRequests: 7, RunningRequests: 12, KVCacheUsage: 0.8125}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := mustPage(t, richState, tt.opts)
			for _, full := range []bool{false, true} {
				p := NewParser(namesOf(t, tt.eng, MetricNameOverrides{}))
				p.fullParse = full
				got, err := p.Parse(page)
				if err != nil {
					t.Fatalf("full=%v: %v", full, err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("full=%v: got %+v, want %+v", full, got, tt.want)
				}
			}
		})
	}
}

// The fast path hands expfmt only the few lines of the used families.
func TestFastPathKeepsFewLines(t *testing.T) {
	page := mustPage(t, richState, vllmpage.Options{MinBytes: 200 << 10})
	p := NewParser(namesOf(t, DefaultEngine, MetricNameOverrides{}))
	if _, err := p.Parse(page); err != nil {
		t.Fatal(err)
	}
	// TYPE lines of seven families and their 1+1+1+3+1 samples, and the
	// two prefix-cache counters' sample per label set (six sets).
	if len(p.keptLines) != 26 {
		t.Errorf("kept %d lines of %d, want 26", len(p.keptLines), strings.Count(string(page), "\n"))
	}
}

func TestParseHandWritten(t *testing.T) {
	names := namesOf(t, DefaultEngine, MetricNameOverrides{})
	tests := []struct {
		name string
		page string
		want datastore.Metrics
		// wantErr is the fast path's error; expfmt's may differ.
		wantErr string
		// fullRejects: expfmt rejects the whole page for a broken family
		// the fast path does not read.
		fullRejects bool
	}{
		{
			name: "untyped minimal page",
			page: "vllm:num_requests_waiting 3\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.5\n",
			want: datastore.Metrics{WaitingRequests: 3, RunningRequests: 4, KVCacheUsage: 0.5},
		},
		{
			name: "data-parallel engines: counts summed, fullest KV cache",
			page: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 3
vllm:num_requests_waiting{engine="1"} 2
vllm:num_requests_running{engine="0"} 1
vllm:num_requests_running{engine="1"} 5
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.75
`,
			want: datastore.Metrics{WaitingRequests: 5, RunningRequests: 6, KVCacheUsage: 0.75},
		},
		{
			name: "newest LoRA series wins, lists trimmed",
			page: base + `vllm:lora_requests_info{max_lora="2",running_lora_adapters=" a , ,b ",waiting_lora_adapters="c,"} 200
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 100
`,
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, RunningAdapters: []string{"a", "b"}, WaitingAdapters: []string{"c"}, MaxAdapters: 2},
		},
		{
			name: "LoRA names that could be no model are dropped, the list bounded",
			page: base + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b\nc,` + strings.Repeat("x", 257) + `,d` + "\x01" + `,e",waiting_lora_adapters="` + strings.Repeat("w,", 300) + `"} 200
`,
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, RunningAdapters: []string{"a", "e"}, WaitingAdapters: slices.Repeat([]string{"w"}, 256), MaxAdapters: 2},
		},
		{
			name: "LoRA tie: greatest labels win, whatever the order (1)",
			page: base + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="x",waiting_lora_adapters=""} 100
vllm:lora_requests_info{max_lora="2",running_lora_adapters="y",waiting_lora_adapters=""} 100
`,
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, RunningAdapters: []string{"y"}, MaxAdapters: 2},
		},
		{
			name: "LoRA tie: greatest labels win, whatever the order (2)",
			page: base + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="y",waiting_lora_adapters=""} 100
vllm:lora_requests_info{max_lora="2",running_lora_adapters="x",waiting_lora_adapters=""} 100
`,
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, RunningAdapters: []string{"y"}, MaxAdapters: 2},
		},
		{
			name: "cache geometry printed as floats",
			page: base + `vllm:cache_config_info{block_size="16.0",num_gpu_blocks="2048"} 1` + "\n",
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, BlockSize: 16, NumBlocks: 2048},
		},
		{
			name: "prefix-cache counters: data-parallel engines summed",
			page: base + `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0"} 3000
vllm:prefix_cache_queries_total{engine="1"} 1000
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0"} 2000
vllm:prefix_cache_hits_total{engine="1"} 500
`,
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, PrefixCacheQueries: 4000, PrefixCacheHits: 2500},
		},
		{
			name: "prefix-cache counters: one absent reads 0",
			page: base + "vllm:prefix_cache_queries_total 3000\n",
			want: datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5, PrefixCacheQueries: 3000},
		},
		{
			name:        "broken unused family is skipped",
			page:        base + "vllm:time_to_first_token_seconds_bucket{le=\"0.1\" 3\n",
			want:        datastore.Metrics{WaitingRequests: 1, RunningRequests: 2, KVCacheUsage: 0.5},
			fullRejects: true,
		},
		{
			name: "quoted UTF-8 names go through the full parser",
			page: `{"vllm:num_requests_waiting",engine="0"} 9` + "\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			want: datastore.Metrics{WaitingRequests: 9, RunningRequests: 2, KVCacheUsage: 0.5},
		},
		{name: "empty page", page: "", wantErr: `metric "vllm:num_requests_waiting" missing from page`},
		{name: "HTML page", page: "<html><body>Not Found</body></html>\n", wantErr: `missing from page`},
		{name: "running missing", page: "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.1\n", wantErr: `metric "vllm:num_requests_running" missing`},
		{name: "kv missing", page: "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\n", wantErr: `metric "vllm:kv_cache_usage_perc" missing`},
		{name: "malformed used line", page: "# a comment\nvllm:num_requests_waiting{engine=\"0\" 1\n", wantErr: "line 2"},
		{name: "value not a number", page: "vllm:num_requests_waiting abc\n", wantErr: `expected float as value, got "abc"`},
		{name: "truncated used line", page: base + "vllm:lora_requests_info{max_lora=\"2\",running", wantErr: "malformed metrics page"},
		{name: "missing final newline", page: "vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting 1", wantErr: "unexpected end of input stream"},
		{name: "negative queue", page: "vllm:num_requests_waiting -1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n", wantErr: "invalid value -1"},
		{name: "NaN queue", page: "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n", wantErr: "invalid value NaN"},
		{name: "implausible queue", page: "vllm:num_requests_waiting 1e300\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n", wantErr: "implausible value"},
		{name: "kv as percent", page: "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 57\n", wantErr: "outside 0..1"},
		{name: "queue is a histogram", page: "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_count 1\nvllm:num_requests_waiting_sum 1\n", wantErr: "is a histogram, want a gauge"},
		{name: "bad max_lora", page: base + `vllm:lora_requests_info{max_lora="many",running_lora_adapters="",waiting_lora_adapters=""} 1` + "\n", wantErr: `max_lora "many"`},
		{name: "prefix-cache hits beyond queries", page: base + "vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 11\n", wantErr: `"vllm:prefix_cache_hits_total" is 11, more than "vllm:prefix_cache_queries_total"'s 10`},
		{name: "negative prefix-cache counter", page: base + "vllm:prefix_cache_queries_total -5\n", wantErr: "invalid value -5"},
		{name: "infinite prefix-cache counter", page: base + "vllm:prefix_cache_queries_total +Inf\n", wantErr: "invalid value +Inf"},
		{name: "bad block size", page: base + `vllm:cache_config_info{block_size="16x",num_gpu_blocks="1"} 1` + "\n", wantErr: `block_size "16x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, full := range []bool{false, true} {
				p := NewParser(names)
				p.fullParse = full
				got, err := p.Parse([]byte(tt.page))
				switch {
				case tt.wantErr != "" && full:
					// expfmt may stop earlier, with its own words.
					if err == nil {
						t.Error("expfmt accepts the page")
					}
				case tt.wantErr != "":
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Errorf("error %v, want one containing %q", err, tt.wantErr)
					}
				case full && tt.fullRejects:
					if err == nil {
						t.Error("expfmt accepts a page with a broken family")
					}
				case err != nil:
					t.Fatalf("full=%v: %v", full, err)
				case !reflect.DeepEqual(got, tt.want):
					t.Errorf("full=%v: got %+v, want %+v", full, got, tt.want)
				}
			}
		})
	}
}

const base = "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"

func TestMetricNameOverrides(t *testing.T) {
	o := MetricNameOverrides{
		TotalQueuedRequests: "q_count", TotalRunningRequests: "run", KVCacheUsagePercentage: "kv",
		LoRAInfo: "lora", CacheInfo: "cache",
	}
	page := "q_count 3\nrun 4\nkv 0.5\nvllm:kv_cache_usage_perc 0.9\nvllm:gpu_cache_usage_perc 0.9\n" +
		`lora{max_lora="1",running_lora_adapters="a",waiting_lora_adapters=""} 5` + "\n" +
		`cache{block_size="32",num_gpu_blocks="10"} 1` + "\n"
	got, err := NewParser(namesOf(t, DefaultEngine, o)).Parse([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	want := datastore.Metrics{WaitingRequests: 3, RunningRequests: 4, KVCacheUsage: 0.5, RunningAdapters: []string{"a"}, MaxAdapters: 1, BlockSize: 32, NumBlocks: 10}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// Overrides name the default engine's metrics only.
	if n := namesOf(t, "sglang", o); n.Waiting.String() != "sglang:num_queue_reqs" {
		t.Errorf("sglang waiting metric %q", n.Waiting)
	}
}

func TestParseEngine(t *testing.T) {
	for in, want := range map[string]Engine{"vllm": "vllm", " SGLang ": "sglang", "trtllm": "trtllm", "TRT-LLM": "trtllm", "tensorrt-llm": "trtllm", "trtllm-serve": "trtllm", "triton": "triton-tensorrt-llm"} {
		if got, err := ParseEngine(in); err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseEngine("tgi"); err == nil || !strings.Contains(err.Error(), `"tgi"`) {
		t.Errorf("ParseEngine(tgi) error %v", err)
	}
}

// fuzzNames are every engine's families, then names with the suffixes
// expfmt folds into histograms and summaries.
func fuzzNames(f *testing.F) []MetricNames {
	var out []MetricNames
	for _, e := range engines {
		out = append(out, e.Metrics)
	}
	return append(out, namesOf(f, DefaultEngine, MetricNameOverrides{TotalQueuedRequests: "q_count", TotalRunningRequests: "q", KVCacheUsagePercentage: "kv_sum_bucket", LoRAInfo: "q_sum", CacheInfo: "kv_sum{a=b}"}))
}

// FuzzParser holds the fast path equal to expfmt's parse of the whole page:
// same result whenever expfmt accepts the page, and when expfmt rejects it
// the fast path fails too unless the rejected line is one it skipped (a
// family it does not use).
func FuzzParser(f *testing.F) {
	names := fuzzNames(f)
	for i, e := range []vllmpage.Engine{vllmpage.VLLM, vllmpage.SGLang, vllmpage.TRTLLM} {
		f.Add(mustPage(f, richState, vllmpage.Options{Engine: e, MinBytes: -1}), uint8(i))
	}
	for i, e := range engines {
		f.Add(fixture(f, e.Name), uint8(i))
	}
	f.Add(mustPage(f, vllmpage.State{Waiting: 1}, vllmpage.Options{LegacyKVCacheName: true, MinBytes: -1}), uint8(0))
	for _, s := range []string{
		base,
		base + "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 3\n",
		"# TYPE q histogram\nq_bucket{le=\"1\"} 1\nq_count 2\nq_sum 3\nkv_sum_bucket 0.5\n",
		"# TYPE q summary\nq_count 2\nq 1\n# TYPE kv_sum gauge\nkv_sum_bucket{le=\"x\"} 1\n",
		"{\"vllm:num_requests_waiting\"} 1\n" + base,
		"vllm:num_requests_waiting\"x\" 1\n",
		"  \t# HELP vllm:num_requests_waiting h\\n\n# TYPE vllm:num_requests_waiting gauge\n" + base,
		"#TYPE vllm:num_requests_waiting counter\n" + base,
		"vllm:num_requests_waiting 1 1700000000\n",
		"vllm:num_requests_waiting{a=\"\\\"\\n\\\\\"} 1\n",
		"x{le=\"1\"} 1\n# TYPE x histogram\n",
		"# HELP q_count c\n# TYPE q histogram\nq_count 3\nq 1\n# HELP q second\n# HELP vllm:num_requests_waiting a\n# HELP vllm:num_requests_waiting b\n" + base,
		base + "# HELP",
		base + "junk{",
		"\n\n\r\n" + base,
	} {
		for i := range names {
			f.Add([]byte(s), uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, page []byte, which uint8) {
		names := names[int(which)%len(names)]
		fast := NewParser(names)
		got, fastErr := fast.Parse(page)
		full := NewParser(names)
		full.fullParse = true
		want, fullErr := full.Parse(page)
		switch {
		case fullErr == nil:
			if fastErr != nil {
				t.Fatalf("expfmt accepts the page, the fast path fails: %v", fastErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("fast path %+v, expfmt %+v", got, want)
			}
		case fastErr == nil:
			var pe expfmt.ParseError
			if !errors.As(fullErr, &pe) {
				t.Fatalf("expfmt's parse fails on the used families (%v), the fast path accepts", fullErr)
			}
			if slices.Contains(fast.keptLines, pe.Line) {
				t.Fatalf("expfmt rejects kept line %d (%v), the fast path accepts", pe.Line, fullErr)
			}
		}
	})
}

// A real page's used families are read with no allocation once the
// parser has seen a page like it: the plain-line reader reuses its
// families, and expfmt (which allocates per line) is left for the rare
// pages outside the plain form.
func TestParsePlainAllocatesNothing(t *testing.T) {
	page := mustPage(t, vllmpage.State{Waiting: 3, Running: 2, KVCacheUsage: 0.5, BlockSize: 16, NumGPUBlocks: 512}, vllmpage.Options{})
	p := NewParser(namesOf(t, DefaultEngine, MetricNameOverrides{}))
	want, err := p.Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	full := NewParser(namesOf(t, DefaultEngine, MetricNameOverrides{}))
	full.fullParse = true
	if ref, err := full.Parse(page); err != nil || !reflect.DeepEqual(ref, want) {
		t.Fatalf("plain reader %+v, expfmt %+v (%v)", want, ref, err)
	}
	if _, ok := p.plainParse(); !ok {
		t.Fatal("a vLLM page's kept lines are not plain")
	}
	if n := testing.AllocsPerRun(20, func() {
		if _, err := p.Parse(page); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a parse, want none", n)
	}
}
