package scrape

import (
	"fmt"
	"strings"
)

// Engine is a model-server family; it decides the metric names read.
type Engine string

// Model-server families.
const (
	VLLM   Engine = "vllm"
	SGLang Engine = "sglang"
	TRTLLM Engine = "trtllm"
)

// ParseEngine reads an engine name as written in an annotation or label.
func ParseEngine(s string) (Engine, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "vllm":
		return VLLM, nil
	case "sglang":
		return SGLang, nil
	case "trtllm", "trt-llm", "tensorrt-llm":
		return TRTLLM, nil
	}
	return "", fmt.Errorf("unknown model-server engine %q (want vllm, sglang or trtllm)", s)
}

// MetricNames are the names of the metric families one engine exports.
// Empty names are not read.
type MetricNames struct {
	// Waiting is the gauge of queued requests (required).
	Waiting string
	// Running is the gauge of running requests (required).
	Running string
	// KVCacheUsage is the gauge of KV-cache use, 0..1 (required).
	KVCacheUsage string
	// KVCacheUsageLegacy is read when KVCacheUsage is absent from a page.
	KVCacheUsageLegacy string
	// LoRAInfo is the LoRA adapter info gauge (optional).
	LoRAInfo string
	// CacheInfo is the cache geometry info gauge (optional), with its block
	// size and block count in the labels BlockSizeLabel and NumBlocksLabel.
	CacheInfo      string
	BlockSizeLabel string
	NumBlocksLabel string
}

// Names returns the engine's metric names; for vLLM, the non-empty
// overrides replace the defaults (the operator's flags name the default
// engine's metrics, as with the reference picker).
func (e Engine) Names(overrides MetricNameOverrides) MetricNames {
	switch e {
	case SGLang:
		return MetricNames{
			Waiting: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs", KVCacheUsage: "sglang:token_usage",
			CacheInfo: "sglang:cache_config_info", BlockSizeLabel: "page_size", NumBlocksLabel: "num_pages",
		}
	case TRTLLM:
		return MetricNames{
			Waiting: "trtllm_num_requests_waiting", Running: "trtllm_num_requests_running", KVCacheUsage: "trtllm_kv_cache_utilization",
		}
	}
	n := MetricNames{
		Waiting: "vllm:num_requests_waiting", Running: "vllm:num_requests_running",
		KVCacheUsage: "vllm:kv_cache_usage_perc", KVCacheUsageLegacy: "vllm:gpu_cache_usage_perc",
		LoRAInfo:  "vllm:lora_requests_info",
		CacheInfo: "vllm:cache_config_info", BlockSizeLabel: "block_size", NumBlocksLabel: "num_gpu_blocks",
	}
	if overrides.TotalQueuedRequests != "" {
		n.Waiting = overrides.TotalQueuedRequests
	}
	if overrides.TotalRunningRequests != "" {
		n.Running = overrides.TotalRunningRequests
	}
	if o := overrides.KVCacheUsagePercentage; o != "" && o != n.KVCacheUsage {
		// An operator-chosen name replaces both the current and the older one.
		n.KVCacheUsage, n.KVCacheUsageLegacy = o, ""
	}
	if overrides.LoRAInfo != "" {
		n.LoRAInfo = overrides.LoRAInfo
	}
	if overrides.CacheInfo != "" {
		n.CacheInfo = overrides.CacheInfo
	}
	return n
}

// MetricNameOverrides rename the default engine's (vLLM's) metric
// families. An empty field keeps the default name.
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
