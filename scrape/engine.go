// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"strings"
)

// Engine names a model-server family as the pod label or pool annotation
// that selects it spells it: the Name of its entry in the engine table.
type Engine string

// DefaultEngine is the family of endpoints whose pod and pool name none.
const DefaultEngine Engine = "vllm"

// EngineSpec is one model-server family: the label values that select it
// and the metric families its pages are read from.
type EngineSpec struct {
	// Name is the value of the engine label or annotation that selects it.
	Name Engine
	// Aliases are other values that select it (other projects' spellings).
	Aliases []string
	// Metrics are the families read from its pages.
	Metrics MetricNames
}

// engines is every model-server family poolpicker reads. A new engine is
// one entry here plus a page of it in testdata/NAME.metrics, which
// TestEveryEngineReadsItsFixture reads with the entry; nothing else in
// poolpicker names engines. The first entry is DefaultEngine's, the one
// the metric-name flags rename. The names and labels follow the engines'
// own /metrics pages and the reference picker's built-in engine configs.
var engines = []EngineSpec{
	{
		Name: "vllm",
		Metrics: MetricNames{
			Waiting:              mustMetric("vllm:num_requests_waiting"),
			Running:              mustMetric("vllm:num_requests_running"),
			KVCacheUsage:         mustMetric("vllm:kv_cache_usage_perc"),
			KVCacheUsageLegacy:   mustMetric("vllm:gpu_cache_usage_perc"),
			LoRAInfo:             mustMetric("vllm:lora_requests_info"),
			RunningAdaptersLabel: "running_lora_adapters", WaitingAdaptersLabel: "waiting_lora_adapters", MaxAdaptersLabel: "max_lora",
			CacheInfo:      mustMetric("vllm:cache_config_info"),
			BlockSizeLabel: "block_size", NumBlocksLabel: "num_gpu_blocks",
			PrefixCacheQueries: mustMetric("vllm:prefix_cache_queries_total"),
			PrefixCacheHits:    mustMetric("vllm:prefix_cache_hits_total"),
		},
	},
	{
		Name: "sglang",
		Metrics: MetricNames{
			Waiting:        mustMetric("sglang:num_queue_reqs"),
			Running:        mustMetric("sglang:num_running_reqs"),
			KVCacheUsage:   mustMetric("sglang:token_usage"),
			CacheInfo:      mustMetric("sglang:cache_config_info"),
			BlockSizeLabel: "page_size", NumBlocksLabel: "num_pages",
		},
	},
	{
		Name:    "trtllm",
		Aliases: []string{"trt-llm", "tensorrt-llm", "trtllm-serve"},
		Metrics: MetricNames{
			Waiting:      mustMetric("trtllm_num_requests_waiting"),
			Running:      mustMetric("trtllm_num_requests_running"),
			KVCacheUsage: mustMetric("trtllm_kv_cache_utilization"),
			BlockSize:    mustMetric("trtllm_kv_cache_tokens_per_block"),
			NumBlocks:    mustMetric("trtllm_kv_cache_max_blocks"),
		},
	},
	{
		// Triton's TensorRT-LLM backend reports its gauges as series of two
		// families, told apart by a label.
		Name:    "triton-tensorrt-llm",
		Aliases: []string{"triton"},
		Metrics: MetricNames{
			Waiting:      mustMetric("nv_trt_llm_request_metrics{request_type=waiting}"),
			Running:      mustMetric("nv_trt_llm_request_metrics{request_type=scheduled}"),
			KVCacheUsage: mustMetric("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),
			BlockSize:    mustMetric("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
			NumBlocks:    mustMetric("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
		},
	},
}

// engineNames lists the table's names for error messages.
func engineNames() string {
	names := make([]string, len(engines))
	for i, e := range engines {
		names[i] = string(e.Name)
	}
	return strings.Join(names, ", ")
}

// ParseEngine reads an engine name as written in a label or annotation.
func ParseEngine(s string) (Engine, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	for _, e := range engines {
		if v == string(e.Name) {
			return e.Name, nil
		}
		for _, a := range e.Aliases {
			if v == a {
				return e.Name, nil
			}
		}
	}
	return "", fmt.Errorf("unknown model-server engine %q (want one of %s)", s, engineNames())
}

// MetricNames are the metric families one engine exports. Zero Metrics are
// not read.
type MetricNames struct {
	// Waiting is the gauge of queued requests (required); a server's series
	// are summed (one per data-parallel rank).
	Waiting Metric
	// Running is the gauge of running requests (required), summed as Waiting.
	Running Metric
	// KVCacheUsage is the gauge of KV-cache use, 0..1 (required); the
	// fullest series counts.
	KVCacheUsage Metric
	// KVCacheUsageLegacy is read when KVCacheUsage's family is absent from
	// a page.
	KVCacheUsageLegacy Metric
	// LoRAInfo is the LoRA adapter info gauge (optional): its newest series
	// (by value, a Unix time) carries the comma-separated running and
	// waiting adapters and the adapter capacity in the three labels named
	// next.
	LoRAInfo             Metric
	RunningAdaptersLabel string
	WaitingAdaptersLabel string
	MaxAdaptersLabel     string
	// CacheInfo is the cache geometry info gauge (optional), with its block
	// size and block count in the labels BlockSizeLabel and NumBlocksLabel.
	CacheInfo      Metric
	BlockSizeLabel string
	NumBlocksLabel string
	// BlockSize and NumBlocks are gauges of the cache geometry (optional),
	// for engines that report it as values rather than info labels.
	BlockSize Metric
	NumBlocks Metric
	// PrefixCacheQueries and PrefixCacheHits are the counters of prompt
	// tokens looked up in the prefix cache and found there (optional); a
	// server's series are summed.
	PrefixCacheQueries Metric
	PrefixCacheHits    Metric
}

// families returns the names of every family read.
func (n *MetricNames) families() []string {
	var out []string
	for _, m := range []Metric{n.Waiting, n.Running, n.KVCacheUsage, n.KVCacheUsageLegacy, n.LoRAInfo, n.CacheInfo, n.BlockSize, n.NumBlocks, n.PrefixCacheQueries, n.PrefixCacheHits} {
		if m.Name != "" {
			out = append(out, m.Name)
		}
	}
	return out
}

// Names returns the families read from e's pages. For DefaultEngine the
// non-empty overrides replace the table's names (the operator's flags name
// the default engine's metrics, as with the reference picker). An unknown
// engine, or an override that is not a metric selector, is an error.
func (e Engine) Names(overrides MetricNameOverrides) (MetricNames, error) {
	for _, spec := range engines {
		if spec.Name != e {
			continue
		}
		n := spec.Metrics
		if e != DefaultEngine {
			return n, nil
		}
		return overrides.apply(n)
	}
	return MetricNames{}, fmt.Errorf("unknown model-server engine %q (want one of %s)", e, engineNames())
}

// DefaultMetricNames returns DefaultEngine's families as the table has them.
func DefaultMetricNames() MetricNames { return engines[0].Metrics }

// MetricNameOverrides rename the default engine's (vLLM's) metric
// families. An empty field keeps the table's name; a set one is a metric
// selector, a name with optional label matchers (see ParseMetric).
type MetricNameOverrides struct {
	// TotalQueuedRequests defaults to vllm:num_requests_waiting.
	TotalQueuedRequests string
	// TotalRunningRequests defaults to vllm:num_requests_running.
	TotalRunningRequests string
	// KVCacheUsagePercentage defaults to vllm:kv_cache_usage_perc, with
	// vllm:gpu_cache_usage_perc read from older servers.
	KVCacheUsagePercentage string
	// LoRAInfo defaults to vllm:lora_requests_info.
	LoRAInfo string
	// CacheInfo defaults to vllm:cache_config_info.
	CacheInfo string
}

func (o MetricNameOverrides) apply(n MetricNames) (MetricNames, error) {
	for _, f := range []struct {
		flag string
		to   *Metric
	}{
		{o.TotalQueuedRequests, &n.Waiting},
		{o.TotalRunningRequests, &n.Running},
		{o.KVCacheUsagePercentage, &n.KVCacheUsage},
		{o.LoRAInfo, &n.LoRAInfo},
		{o.CacheInfo, &n.CacheInfo},
	} {
		if f.flag == "" {
			continue
		}
		m, err := ParseMetric(f.flag)
		if err != nil {
			return n, err
		}
		if f.to == &n.KVCacheUsage && !m.equal(n.KVCacheUsage) {
			// An operator-chosen name replaces both the current and the older one.
			n.KVCacheUsageLegacy = Metric{}
		}
		*f.to = m
	}
	return n, nil
}

// resolveNames returns every engine's families, the default engine's with
// the overrides applied.
func resolveNames(overrides MetricNameOverrides) (map[Engine]*MetricNames, error) {
	out := make(map[Engine]*MetricNames, len(engines))
	for _, e := range engines {
		n, err := e.Name.Names(overrides)
		if err != nil {
			return nil, err
		}
		out[e.Name] = &n
	}
	return out, nil
}
