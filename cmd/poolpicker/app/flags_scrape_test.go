// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"reflect"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/scrape"
)

func TestBindScrapeFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want scrape.Options
	}{
		{
			name: "defaults",
			want: scrape.Options{
				RefreshInterval: 50 * time.Millisecond, IdleRefreshInterval: 30 * time.Second, StalenessThreshold: scrape.DefaultStalenessThreshold, Timeout: scrape.DefaultTimeout,
				MaxBodyBytes: scrape.DefaultMaxBodyBytes, MaxConcurrentScrapes: scrape.DefaultMaxConcurrentScrapes, MaxIdleConns: scrape.DefaultMaxIdleConns, MaxServerCPUShare: scrape.DefaultMaxServerCPUShare, Path: "/metrics", Scheme: "http",
				MetricNames: scrape.MetricNameOverrides{
					TotalQueuedRequests: "vllm:num_requests_waiting", TotalRunningRequests: "vllm:num_requests_running",
					KVCacheUsagePercentage: "vllm:kv_cache_usage_perc", LoRAInfo: "vllm:lora_requests_info", CacheInfo: "vllm:cache_config_info",
				},
			},
		},
		{
			name: "all set",
			args: []string{
				"--refresh-metrics-interval=100ms", "--idle-refresh-metrics-interval=10s", "--metrics-staleness-threshold=5s", "--metrics-scrape-timeout=300ms",
				"--metrics-max-body-bytes=1000", "--metrics-max-idle-conns=10", "--model-server-metrics-path=/m",
				"--metrics-max-concurrent-scrapes=64", "--metrics-max-concurrent-scrapes-per-pool=8",
				"--model-server-metrics-port=9090", "--model-server-metrics-scheme=https", "--model-server-metrics-https-insecure-skip-verify=false",
				"--total-queued-requests-metric=q", "--total-running-requests-metric=r", "--kv-cache-usage-percentage-metric=kv",
				"--lora-info-metric=l", "--cache-info-metric=c",
			},
			want: scrape.Options{
				RefreshInterval: 100 * time.Millisecond, IdleRefreshInterval: 10 * time.Second, StalenessThreshold: 5 * time.Second, Timeout: 300 * time.Millisecond,
				MaxBodyBytes: 1000, MaxConcurrentScrapes: 64, MaxConcurrentScrapesPerPool: 8, MaxIdleConns: 10, MaxServerCPUShare: scrape.DefaultMaxServerCPUShare, Path: "/m", Port: 9090, Scheme: "https", VerifyServerCertificates: true,
				MetricNames: scrape.MetricNameOverrides{TotalQueuedRequests: "q", TotalRunningRequests: "r", KVCacheUsagePercentage: "kv", LoRAInfo: "l", CacheInfo: "c"},
			},
		},
		{
			// 0 is the flag's "every server every --refresh-metrics-interval",
			// which the library spells negative (its zero is the default).
			name: "idle interval off",
			args: []string{"--idle-refresh-metrics-interval=0"},
			want: scrape.Options{
				RefreshInterval: 50 * time.Millisecond, IdleRefreshInterval: -1, StalenessThreshold: scrape.DefaultStalenessThreshold, Timeout: scrape.DefaultTimeout,
				MaxBodyBytes: scrape.DefaultMaxBodyBytes, MaxConcurrentScrapes: scrape.DefaultMaxConcurrentScrapes, MaxIdleConns: scrape.DefaultMaxIdleConns, MaxServerCPUShare: scrape.DefaultMaxServerCPUShare, Path: "/metrics", Scheme: "http",
				MetricNames: scrape.MetricNameOverrides{
					TotalQueuedRequests: "vllm:num_requests_waiting", TotalRunningRequests: "vllm:num_requests_running",
					KVCacheUsagePercentage: "vllm:kv_cache_usage_perc", LoRAInfo: "vllm:lora_requests_info", CacheInfo: "vllm:cache_config_info",
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
			var got scrape.Options
			bindScrapeFlags(fs, &got)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// With the flags' defaults, older vLLM servers' KV-cache gauge is still read.
func TestDefaultFlagsKeepOlderKVName(t *testing.T) {
	fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
	var o scrape.Options
	bindScrapeFlags(fs, &o)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	n, err := scrape.DefaultEngine.Names(o.MetricNames)
	if err != nil || n.KVCacheUsageLegacy.String() != "vllm:gpu_cache_usage_perc" {
		t.Errorf("older KV-cache name dropped: %+v", n)
	}
}
