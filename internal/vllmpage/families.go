// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package vllmpage

import (
	"bytes"
	"strconv"
)

// engineFamilies names one engine's metric families and says how its series
// are labelled.
type engineFamilies struct {
	waiting, running, kvUsage string
	// loraInfo is empty where the engine has no LoRA info family.
	loraInfo string
	// cacheConfig is empty where the engine exports no cache geometry.
	cacheConfig                    string
	blockSizeLabel, numBlocksLabel string
	// otherGauges are [name, help] of gauges a picker does not read.
	otherGauges [][2]string
	counters    []counterFamily
	histograms  []histogramFamily
	// seriesLabels writes the labels (without braces) of label set i.
	seriesLabels func(b *bytes.Buffer, model string, set int)
}

type counterFamily struct {
	name, help string
	// perRequest is the counter's increase per served request.
	perRequest int
	// extraLabels split the counter into series (pre-rendered `k="v"`).
	extraLabels []string
	// value, when set, reads the counter from the state's prefix-cache
	// counters, when the state has them.
	value func(*State) int
}

type histogramFamily struct {
	name, help string
	// buckets are the upper bounds as the server prints them, ending in +Inf.
	buckets []string
	// perRequest is the number of observations per served request.
	perRequest int
}

// Bucket layouts of vLLM's histograms.
var (
	latencyBuckets      = []string{"0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"}
	tokenLatencyBuckets = []string{"0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"}
	ttftBuckets         = []string{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"}
	tokenCountBuckets   = []string{"1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0", "5000.0", "10000.0", "20000.0", "50000.0", "+Inf"}
	iterationBuckets    = []string{"1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0", "4096.0", "8192.0", "16384.0", "+Inf"}
	smallCountBuckets   = []string{"1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"}
)

var families = map[Engine]engineFamilies{
	VLLM: {
		waiting:        "vllm:num_requests_waiting",
		running:        "vllm:num_requests_running",
		kvUsage:        "vllm:kv_cache_usage_perc",
		loraInfo:       "vllm:lora_requests_info",
		cacheConfig:    "vllm:cache_config_info",
		blockSizeLabel: "block_size",
		numBlocksLabel: "num_gpu_blocks",
		otherGauges: [][2]string{
			{"vllm:num_requests_swapped", "Number of requests swapped to CPU."},
			{"vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage."},
		},
		counters: []counterFamily{
			{name: "vllm:num_preemptions_total", help: "Cumulative number of preemption from the engine."},
			{name: "vllm:prompt_tokens_total", help: "Number of prefill tokens processed.", perRequest: 342},
			{name: "vllm:generation_tokens_total", help: "Number of generation tokens processed.", perRequest: 305},
			{name: "vllm:prefix_cache_queries_total", help: "Prefix cache queries, in terms of number of queried tokens.", perRequest: 342,
				value: func(s *State) int { return s.PrefixCacheQueries }},
			{name: "vllm:prefix_cache_hits_total", help: "Prefix cache hits, in terms of number of cached tokens.", perRequest: 120,
				value: func(s *State) int { return s.PrefixCacheHits }},
			{name: "vllm:request_success_total", help: "Count of successfully processed requests.", perRequest: 1,
				extraLabels: []string{`finished_reason="stop"`, `finished_reason="length"`, `finished_reason="abort"`}},
		},
		histograms: []histogramFamily{
			{name: "vllm:iteration_tokens_total", help: "Histogram of number of tokens per engine_step.", buckets: iterationBuckets, perRequest: 9},
			{name: "vllm:time_to_first_token_seconds", help: "Histogram of time to first token in seconds.", buckets: ttftBuckets},
			{name: "vllm:time_per_output_token_seconds", help: "Histogram of time per output token in seconds.", buckets: tokenLatencyBuckets, perRequest: 8},
			{name: "vllm:inter_token_latency_seconds", help: "Histogram of inter-token latency in seconds.", buckets: tokenLatencyBuckets, perRequest: 8},
			{name: "vllm:e2e_request_latency_seconds", help: "Histogram of e2e request latency in seconds.", buckets: latencyBuckets},
			{name: "vllm:request_queue_time_seconds", help: "Histogram of time spent in WAITING phase for request.", buckets: latencyBuckets},
			{name: "vllm:request_inference_time_seconds", help: "Histogram of time spent in RUNNING phase for request.", buckets: latencyBuckets},
			{name: "vllm:request_prefill_time_seconds", help: "Histogram of time spent in PREFILL phase for request.", buckets: latencyBuckets},
			{name: "vllm:request_decode_time_seconds", help: "Histogram of time spent in DECODE phase for request.", buckets: latencyBuckets},
			{name: "vllm:request_time_per_output_token_seconds", help: "Histogram of time_per_output_token_seconds per request.", buckets: tokenLatencyBuckets},
			{name: "vllm:request_prompt_tokens", help: "Number of prefill tokens processed.", buckets: tokenCountBuckets},
			{name: "vllm:request_generation_tokens", help: "Number of generation tokens processed.", buckets: tokenCountBuckets},
			{name: "vllm:request_max_num_generation_tokens", help: "Histogram of maximum number of requested generation tokens.", buckets: tokenCountBuckets},
			{name: "vllm:request_params_n", help: "Histogram of the n request parameter.", buckets: smallCountBuckets},
			{name: "vllm:request_params_max_tokens", help: "Histogram of the max_tokens request parameter.", buckets: tokenCountBuckets},
		},
		seriesLabels: func(b *bytes.Buffer, model string, set int) {
			b.WriteString(`engine="`)
			b.WriteString(strconv.Itoa(set))
			b.WriteString(`",model_name="`)
			b.WriteString(model)
			b.WriteByte('"')
		},
	},
	SGLang: {
		waiting:        "sglang:num_queue_reqs",
		running:        "sglang:num_running_reqs",
		kvUsage:        "sglang:token_usage",
		cacheConfig:    "sglang:cache_config_info",
		blockSizeLabel: "page_size",
		numBlocksLabel: "num_pages",
		otherGauges: [][2]string{
			{"sglang:num_used_tokens", "The number of used tokens."},
			{"sglang:gen_throughput", "The generation throughput (token/s)."},
			{"sglang:cache_hit_rate", "The prefix cache hit rate."},
			{"sglang:spec_accept_length", "The average acceptance length of speculative decoding."},
			{"sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."},
		},
		counters: []counterFamily{
			{name: "sglang:prompt_tokens_total", help: "Number of prefill tokens processed.", perRequest: 342},
			{name: "sglang:generation_tokens_total", help: "Number of generation tokens processed.", perRequest: 305},
			{name: "sglang:cached_tokens_total", help: "Number of cached prompt tokens.", perRequest: 120},
			{name: "sglang:num_requests_total", help: "Number of requests processed.", perRequest: 1},
			{name: "sglang:num_aborted_requests_total", help: "Number of requests aborted."},
		},
		histograms: []histogramFamily{
			{name: "sglang:time_to_first_token_seconds", help: "Histogram of time to first token in seconds.", buckets: ttftBuckets},
			{name: "sglang:inter_token_latency_seconds", help: "Histogram of inter-token latency in seconds.", buckets: tokenLatencyBuckets, perRequest: 8},
			{name: "sglang:e2e_request_latency_seconds", help: "Histogram of End-to-end request latency in seconds", buckets: latencyBuckets},
			{name: "sglang:queue_time_seconds", help: "Histogram of queueing time in seconds.", buckets: latencyBuckets},
			{name: "sglang:prompt_tokens_histogram", help: "Histogram of prompt token length.", buckets: tokenCountBuckets},
			{name: "sglang:generation_tokens_histogram", help: "Histogram of generation token length.", buckets: tokenCountBuckets},
			{name: "sglang:per_stage_req_latency_seconds", help: "The latency of each stage of requests.", buckets: tokenLatencyBuckets},
		},
		seriesLabels: func(b *bytes.Buffer, model string, set int) {
			b.WriteString(`model_name="`)
			b.WriteString(model)
			b.WriteString(`",tp_rank="`)
			b.WriteString(strconv.Itoa(set))
			b.WriteByte('"')
		},
	},
	TRTLLM: {
		waiting: "trtllm_num_requests_waiting",
		running: "trtllm_num_requests_running",
		kvUsage: "trtllm_kv_cache_utilization",
		otherGauges: [][2]string{
			{"trtllm_kv_cache_hit_rate", "KV cache hit rate."},
			{"trtllm_num_requests_paused", "Number of paused requests."},
		},
		counters: []counterFamily{
			{name: "trtllm_request_success_total", help: "Count of successfully processed requests.", perRequest: 1,
				extraLabels: []string{`finished_reason="stop"`, `finished_reason="length"`}},
			{name: "trtllm_prompt_tokens_total", help: "Number of prefill tokens processed.", perRequest: 342},
			{name: "trtllm_generation_tokens_total", help: "Number of generation tokens processed.", perRequest: 305},
		},
		histograms: []histogramFamily{
			{name: "trtllm_time_to_first_token_seconds", help: "Histogram of time to first token in seconds.", buckets: ttftBuckets},
			{name: "trtllm_time_per_output_token_seconds", help: "Histogram of time per output token in seconds.", buckets: tokenLatencyBuckets, perRequest: 8},
			{name: "trtllm_e2e_request_latency_seconds", help: "Histogram of end to end request latency in seconds.", buckets: latencyBuckets},
			{name: "trtllm_request_queue_time_seconds", help: "Histogram of time spent in WAITING phase for request.", buckets: latencyBuckets},
			{name: "trtllm_request_prompt_tokens", help: "Number of prefill tokens processed.", buckets: tokenCountBuckets},
			{name: "trtllm_request_generation_tokens", help: "Number of generation tokens processed.", buckets: tokenCountBuckets},
		},
		seriesLabels: func(b *bytes.Buffer, model string, set int) {
			b.WriteString(`engine="`)
			b.WriteString(strconv.Itoa(set))
			b.WriteString(`",engine_type="trtllm",model_name="`)
			b.WriteString(model)
			b.WriteByte('"')
		},
	},
}
