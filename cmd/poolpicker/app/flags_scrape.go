// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/scrape"
)

// bindScrapeFlags binds the model-server metrics flags to o. Flag names
// follow the reference picker's where it has one, so existing deployments'
// arguments keep working.
func bindScrapeFlags(fs *pflag.FlagSet, o *scrape.Options) {
	fs.DurationVar(&o.RefreshInterval, "refresh-metrics-interval", scrape.DefaultRefreshInterval,
		"Time between two scrapes of a model server's metrics while one of its pools had a request in the last 5 s.")
	o.IdleRefreshInterval = scrape.DefaultIdleRefreshInterval
	fs.Var(zeroDisablesDuration{&o.IdleRefreshInterval}, "idle-refresh-metrics-interval",
		"Longest time between two scrapes of a model server none of whose pools had a request in the last 5 s: its interval doubles up to this, its last values stay valid for two intervals, and a pool's first request has its servers scraped at once. 0 scrapes every server every --refresh-metrics-interval.")
	fs.DurationVar(&o.StalenessThreshold, "metrics-staleness-threshold", scrape.DefaultStalenessThreshold,
		"Age past which an endpoint's metrics are stale; an endpoint with stale or no metrics has unknown load and is not picked on load.")
	fs.DurationVar(&o.Timeout, "metrics-scrape-timeout", scrape.DefaultTimeout,
		"Bound of one scrape: connecting, the request and reading the page.")
	fs.Float64Var(&o.CPUBudget, "metrics-scrape-cpu-budget", 0,
		"CPU the model-server metrics scrapes may use, in cores: scrapes are admitted at the rate it pays for, so that picks keep the rest of the cores; when it cannot pay for every busy server at --refresh-metrics-interval, busy pools share it by request rate. 0 means half of the process's cores (GOMAXPROCS); a negative value sets no budget.")
	fs.Int64Var(&o.MaxBodyBytes, "metrics-max-body-bytes", scrape.DefaultMaxBodyBytes,
		"Largest metrics page read; a larger one fails the scrape. A response may carry 64 KiB of headers and 64 KiB of chunk framing and trailers beyond it.")
	fs.Float64Var(&o.MaxServerCPUShare, "metrics-scrape-max-server-cpu-share", scrape.DefaultMaxServerCPUShare,
		"Share of one core one model server's scrapes may use: a server whose page costs more to read at its interval is scraped less often (by its own pools only). A negative value sets no bound.")
	fs.IntVar(&o.MaxConcurrentScrapes, "metrics-max-concurrent-scrapes", scrape.DefaultMaxConcurrentScrapes,
		"Scrapes of model servers in flight at once, shared fairly between namespaces and their pools (as --max-concurrent-streams is): a pool may borrow the slots others leave idle, but servers that hang until --metrics-scrape-timeout hold only their tenant's share (per pool: poolpicker_fair_share_used{limit=\""+scrape.LimitInFlightScrapes+"\"}). 0 means the default.")
	fs.IntVar(&o.MaxConcurrentScrapesPerPool, "metrics-max-concurrent-scrapes-per-pool", 0,
		"Most scrapes of one pool's servers in flight at once, whatever its fair share. 0 means a quarter of --metrics-max-concurrent-scrapes.")
	fs.IntVar(&o.MaxIdleConns, "metrics-max-idle-conns", scrape.DefaultMaxIdleConns,
		"Keep-alive connections kept to idle model servers in all (busy ones always keep theirs; past it an idle server dials again for each scrape); each is a file descriptor.")
	fs.StringVar(&o.Path, "model-server-metrics-path", scrape.DefaultPath,
		"Metrics path of the model servers; a pool's "+scrape.AnnotationMetricsPath+" annotation overrides it.")
	fs.Int32Var(&o.Port, "model-server-metrics-port", 0,
		"Metrics port of the model servers; 0 means each endpoint's target port. A pool's "+scrape.AnnotationMetricsPort+" annotation overrides it.")
	fs.StringVar(&o.Scheme, "model-server-metrics-scheme", scrape.DefaultScheme,
		"Scheme of the model servers' metrics, http or https; a pool's "+scrape.AnnotationMetricsScheme+" annotation overrides it.")
	skip := fs.VarPF(&invertedBool{p: &o.VerifyServerCertificates}, "model-server-metrics-https-insecure-skip-verify", "",
		"Skip verifying model servers' certificates over https (they are usually self-signed).")
	skip.DefValue, skip.NoOptDefVal = "true", "true"
	vllm := scrape.DefaultMetricNames()
	const engines = " Names the default (vLLM) engine's metric, as name or name{label=value,...}; pods and pools that name another engine" +
		" (label " + scrape.LabelEngineType + " or " + scrape.LabelModelServerEngine + ") use that engine's names."
	fs.StringVar(&o.MetricNames.TotalQueuedRequests, "total-queued-requests-metric", vllm.Waiting.String(),
		"Gauge of a model server's queued requests."+engines)
	fs.StringVar(&o.MetricNames.TotalRunningRequests, "total-running-requests-metric", vllm.Running.String(),
		"Gauge of a model server's running requests."+engines)
	fs.StringVar(&o.MetricNames.KVCacheUsagePercentage, "kv-cache-usage-percentage-metric", vllm.KVCacheUsage.String(),
		"Gauge of a model server's KV-cache utilization, 0..1 (with the default, older vLLM's "+vllm.KVCacheUsageLegacy.String()+" is read too)."+engines)
	fs.StringVar(&o.MetricNames.LoRAInfo, "lora-info-metric", vllm.LoRAInfo.String(),
		"Info gauge of a model server's LoRA adapters ("+vllm.RunningAdaptersLabel+", "+vllm.WaitingAdaptersLabel+", "+vllm.MaxAdaptersLabel+")."+engines)
	fs.StringVar(&o.MetricNames.CacheInfo, "cache-info-metric", vllm.CacheInfo.String(),
		"Info gauge of a model server's KV-cache geometry ("+vllm.BlockSizeLabel+", "+vllm.NumBlocksLabel+")."+engines)
}

// zeroDisablesDuration is a duration flag whose 0 means "off", stored as
// the negative value its Options field takes for off (zero there is the
// default).
type zeroDisablesDuration struct{ p *time.Duration }

func (d zeroDisablesDuration) String() string {
	if d.p == nil || *d.p < 0 {
		return "0s"
	}
	return d.p.String()
}

func (d zeroDisablesDuration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v <= 0 {
		v = -1
	}
	*d.p = v
	return nil
}

func (zeroDisablesDuration) Type() string { return "duration" }
