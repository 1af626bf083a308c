// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package vllmpage

import (
	"bytes"
	"math"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parse(t *testing.T, page []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		t.Fatalf("page does not parse: %v", err)
	}
	return fams
}

func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("family %s missing", name)
	}
	if f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != 1 {
		t.Fatalf("family %s: type %v with %d series, want one gauge", name, f.GetType(), len(f.Metric))
	}
	return f.Metric[0].GetGauge().GetValue()
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestPageCarriesState(t *testing.T) {
	state := State{
		Waiting: 7, Running: 3, KVCacheUsage: 0.625,
		RunningAdapters: []string{"sql-lora", "food-review"}, WaitingAdapters: []string{"tweet"},
		MaxLoRA: 4, LoRAUpdatedAt: 1.8e9, BlockSize: 16, NumGPUBlocks: 8192, ServedRequests: 1234,
	}
	tests := []struct {
		engine                      Engine
		waiting, running, kv        string
		cache, blockLabel, numLabel string
		lora                        string
		wantHistograms              int
	}{
		{VLLM, "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info", "block_size", "num_gpu_blocks", "vllm:lora_requests_info", 15},
		{SGLang, "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info", "page_size", "num_pages", "", 7},
		{TRTLLM, "trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization", "", "", "", "", 6},
	}
	for _, tt := range tests {
		t.Run(string(tt.engine), func(t *testing.T) {
			page, err := Page(state, Options{Engine: tt.engine})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) < DefaultMinBytes {
				t.Errorf("page is %d bytes, want at least %d", len(page), DefaultMinBytes)
			}
			fams := parse(t, page)
			if got := gauge(t, fams, tt.waiting); got != 7 {
				t.Errorf("waiting = %v, want 7", got)
			}
			if got := gauge(t, fams, tt.running); got != 3 {
				t.Errorf("running = %v, want 3", got)
			}
			if got := gauge(t, fams, tt.kv); got != 0.625 {
				t.Errorf("kv = %v, want 0.625", got)
			}
			if tt.cache != "" {
				f := fams[tt.cache]
				if f == nil || len(f.Metric) != 1 {
					t.Fatalf("cache config family %s missing", tt.cache)
				}
				if b, n := label(f.Metric[0], tt.blockLabel), label(f.Metric[0], tt.numLabel); b != "16" || n != "8192" {
					t.Errorf("cache config %s=%q %s=%q, want 16 and 8192", tt.blockLabel, b, tt.numLabel, n)
				}
			}
			if tt.lora != "" {
				f := fams[tt.lora]
				if f == nil || len(f.Metric) != 3 {
					t.Fatalf("lora family %s: want current and 2 older series, got %v", tt.lora, f)
				}
				var newest *dto.Metric
				for _, m := range f.Metric {
					if newest == nil || m.GetGauge().GetValue() > newest.GetGauge().GetValue() {
						newest = m
					}
				}
				if r, w, mx := label(newest, "running_lora_adapters"), label(newest, "waiting_lora_adapters"), label(newest, "max_lora"); r != "sql-lora,food-review" || w != "tweet" || mx != "4" || newest.GetGauge().GetValue() != 1.8e9 {
					t.Errorf("newest lora series running=%q waiting=%q max=%q value=%v", r, w, mx, newest.GetGauge().GetValue())
				}
			}
			histograms := 0
			for name, f := range fams {
				if f.GetType() != dto.MetricType_HISTOGRAM {
					continue
				}
				histograms++
				for _, m := range f.Metric {
					h := m.GetHistogram()
					if len(h.Bucket) < 6 {
						t.Errorf("%s has %d buckets, want many", name, len(h.Bucket))
					}
					prev := uint64(0)
					for _, b := range h.Bucket {
						if b.GetCumulativeCount() < prev {
							t.Errorf("%s buckets not cumulative", name)
						}
						prev = b.GetCumulativeCount()
					}
					last := h.Bucket[len(h.Bucket)-1]
					if !math.IsInf(last.GetUpperBound(), 1) || last.GetCumulativeCount() != h.GetSampleCount() || h.GetSampleCount() == 0 {
						t.Errorf("%s: +Inf bucket %v, count %d", name, last, h.GetSampleCount())
					}
				}
			}
			if histograms != tt.wantHistograms {
				t.Errorf("%d histogram families, want %d", histograms, tt.wantHistograms)
			}
		})
	}
}

func TestPageIsDeterministic(t *testing.T) {
	s := State{Waiting: 1, Running: 2, KVCacheUsage: 0.5, ServedRequests: 99, MaxLoRA: 2, RunningAdapters: []string{"a"}}
	for _, e := range []Engine{VLLM, SGLang, TRTLLM} {
		a, err := Page(s, Options{Engine: e, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		// Pages of another shape in between must not change the next one.
		if _, err := Page(State{ServedRequests: 1 << 40}, Options{Engine: e, Seed: 7}); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := Write(&b, s, Options{Engine: e, Seed: 7}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b.Bytes()) {
			t.Errorf("%s: two pages of one input differ", e)
		}
		c, _ := Page(s, Options{Engine: e, Seed: 8})
		if bytes.Equal(a, c) {
			t.Errorf("%s: seeds 7 and 8 give the same histograms", e)
		}
	}
}

func TestPageSize(t *testing.T) {
	tests := []struct {
		name     string
		opts     Options
		min, max int
	}{
		{"default", Options{}, DefaultMinBytes, 2 * DefaultMinBytes},
		{"200KB", Options{MinBytes: 200 << 10}, 200 << 10, 260 << 10},
		{"200KB sglang", Options{Engine: SGLang, MinBytes: 200 << 10}, 200 << 10, 260 << 10},
		{"1MB trtllm", Options{Engine: TRTLLM, MinBytes: 1 << 20}, 1 << 20, 1200 << 10},
		{"one label set", Options{MinBytes: -1}, 10 << 10, DefaultMinBytes * 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := Page(State{Waiting: 1, ServedRequests: 10}, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) < tt.min || len(page) > tt.max {
				t.Errorf("page is %d bytes, want %d..%d", len(page), tt.min, tt.max)
			}
			parse(t, page)
		})
	}
}

func TestLegacyKVCacheName(t *testing.T) {
	page, err := Page(State{KVCacheUsage: 0.25}, Options{LegacyKVCacheName: true})
	if err != nil {
		t.Fatal(err)
	}
	fams := parse(t, page)
	if got := gauge(t, fams, "vllm:gpu_cache_usage_perc"); got != 0.25 {
		t.Errorf("gpu_cache_usage_perc = %v, want 0.25", got)
	}
	if _, ok := fams["vllm:kv_cache_usage_perc"]; ok {
		t.Error("legacy page also carries the new name")
	}
}

func TestOptionalFamiliesOmitted(t *testing.T) {
	page, err := Page(State{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"vllm:lora_requests_info", "vllm:cache_config_info"} {
		if bytes.Contains(page, []byte(name)) {
			t.Errorf("zero state writes %s", name)
		}
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name string
		s    State
		o    Options
		want string
	}{
		{"unknown engine", State{}, Options{Engine: "tgi"}, `unknown engine "tgi"`},
		{"kv above one", State{KVCacheUsage: 1.5}, Options{}, "outside 0..1"},
		{"kv NaN", State{KVCacheUsage: math.NaN()}, Options{}, "outside 0..1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Page(tt.s, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func BenchmarkWrite(b *testing.B) {
	s := State{Waiting: 3, Running: 5, KVCacheUsage: 0.4, ServedRequests: 5000, MaxLoRA: 2, RunningAdapters: []string{"a"}}
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := Write(&buf, s, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(buf.Len()))
}
