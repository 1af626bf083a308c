// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// bindSchedulingFlags binds the scheduler's flags to o; --help shows the
// scheduler's defaults. Two options have no flag of their own, so that one
// setting never has two knobs that could disagree: set o.MetricsStaleness
// from the scraper's --metrics-staleness-threshold, and
// o.EnableConformanceTestFilter from the ext_proc server's conformance option.
func bindSchedulingFlags(fs *pflag.FlagSet, o *scheduling.Options) {
	fs.StringVar(&o.ConfigFile, "config-file", o.ConfigFile,
		"Path of an EndpointPickerConfig YAML file (apiVersion "+scheduling.ConfigAPIVersion+") declaring plugins and scheduling profiles. Empty: --config-text, else the built-in default. A pool picks its profile with the annotation "+scheduling.ProfileAnnotation+".")
	fs.StringVar(&o.ConfigText, "config-text", o.ConfigText,
		"An EndpointPickerConfig given inline, instead of --config-file.")
	fs.IntVar(&o.MaxEndpoints, "scheduler-max-endpoints", scheduling.DefaultMaxEndpoints,
		"Most endpoints sent to the gateway per request: the primary, then fallbacks to retry in order. 0 means the default.")
	fs.IntVar(&o.QueueDepthThreshold, "saturation-queue-depth-threshold", scheduling.DefaultQueueDepthThreshold,
		"Waiting requests at which an endpoint is saturated. See --saturation-admission. 0 means the default.")
	fs.Float64Var(&o.KVCacheUtilThreshold, "saturation-kv-cache-threshold", scheduling.DefaultKVCacheUtilThreshold,
		"KV-cache use (0..1] at which an endpoint is saturated; see --saturation-queue-depth-threshold. 0 means the default.")
	fs.StringVar(&o.SaturationAdmission, "saturation-admission", scheduling.DefaultSaturationAdmission,
		"When a pool is saturated, so that sheddable requests (objective priority < 0) are answered 429: "+scheduling.AdmissionAllSaturated+", when every endpoint is saturated (or unknown); "+scheduling.AdmissionPoolAverage+", when the endpoints' mean of max(waiting / queue-depth threshold, KV-cache use / KV-cache threshold) is at least 1, an unknown endpoint counting 1.")
	fs.IntVar(&o.DecisionsPerPool, "debug-decisions-per-pool", scheduling.DefaultDecisionsPerPool,
		"Last decisions kept per pool, with each scorer's score of each candidate, for the metrics port's /debug/pools. A pool's are kept from its first pick until it is no longer served. Negative: none. 0 means the default.")
}

// bindPrefixIndexFlag binds the prefix indexes' process-wide memory budget.
func bindPrefixIndexFlag(fs *pflag.FlagSet, maxBytes *int64) {
	fs.Int64Var(maxBytes, prefix.MemoryFlag, prefix.DefaultMaxIndexBytes,
		"Memory the prefix-cache indexes may hold over every pool, in bytes (counted as 128 bytes a block): the prefix-cache scorers' learned indexes and the precise scorers' KV-event indexes together, shared fairly between namespaces and their pools (a pool past its share forgets its least recent blocks; per-pool use: poolpicker_fair_share_used{limit=\""+prefix.MemoryLimitName+"\"}). A scorer whose maxIndexBytes parameter is set has a budget of its own. Negative: no bound. 0 means the default.")
}
