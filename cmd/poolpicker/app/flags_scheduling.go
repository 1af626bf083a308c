// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/scheduling"
)

// bindSchedulingFlags binds the scheduler's flags to o; --help shows the
// scheduler's defaults. Two options have no flag of their own, so that one
// setting never has two knobs that could disagree: set o.MetricsStaleness
// from the scraper's --metrics-staleness-threshold, and
// o.EnableConformanceTestFilter from the ext_proc server's conformance option.
func bindSchedulingFlags(fs *pflag.FlagSet, o *scheduling.Options) {
	if o.MaxEndpoints == 0 {
		o.MaxEndpoints = scheduling.DefaultMaxEndpoints
	}
	if o.MetricsStaleness == 0 {
		o.MetricsStaleness = scheduling.DefaultMetricsStaleness
	}
	if o.QueueDepthThreshold == 0 {
		o.QueueDepthThreshold = scheduling.DefaultQueueDepthThreshold
	}
	if o.KVCacheUtilThreshold == 0 {
		o.KVCacheUtilThreshold = scheduling.DefaultKVCacheUtilThreshold
	}
	fs.StringVar(&o.ConfigFile, "config-file", o.ConfigFile,
		"Path of an EndpointPickerConfig YAML file (apiVersion "+scheduling.ConfigAPIVersion+") declaring plugins and scheduling profiles. Empty: --config-text, else the built-in default. A pool picks its profile with the annotation "+scheduling.ProfileAnnotation+".")
	fs.StringVar(&o.ConfigText, "config-text", o.ConfigText,
		"An EndpointPickerConfig given inline, instead of --config-file.")
	fs.IntVar(&o.MaxEndpoints, "scheduler-max-endpoints", o.MaxEndpoints,
		"Most endpoints sent to the gateway per request: the primary, then fallbacks to retry in order.")
	fs.IntVar(&o.QueueDepthThreshold, "saturation-queue-depth-threshold", o.QueueDepthThreshold,
		"Waiting requests at which an endpoint is saturated. When every endpoint of a pool is saturated (or unknown), sheddable requests (objective priority < 0) are answered 429.")
	fs.Float64Var(&o.KVCacheUtilThreshold, "saturation-kv-cache-threshold", o.KVCacheUtilThreshold,
		"KV-cache use (0..1) at which an endpoint is saturated; see --saturation-queue-depth-threshold.")
}

// newScheduler checks the flags' values and builds the scheduler from cfg,
// or (cfg nil) from the config file or text they name. Every error names its culprit (flag, file,
// plugin, parameter or profile) and is meant to stop start-up. Register the
// result with the datastore registry (AddObserver) before pools are added.
func newScheduler(o scheduling.Options, cfg *scheduling.Config) (*scheduling.Scheduler, error) {
	switch {
	case o.MaxEndpoints < 1:
		return nil, fmt.Errorf("--scheduler-max-endpoints %d: must be at least 1", o.MaxEndpoints)
	case o.MetricsStaleness <= 0:
		return nil, fmt.Errorf("metrics staleness %v: must be positive", o.MetricsStaleness)
	case o.QueueDepthThreshold < 1:
		return nil, fmt.Errorf("--saturation-queue-depth-threshold %d: must be at least 1", o.QueueDepthThreshold)
	case !(o.KVCacheUtilThreshold > 0 && o.KVCacheUtilThreshold <= 1):
		return nil, fmt.Errorf("--saturation-kv-cache-threshold %v: must be in (0, 1]", o.KVCacheUtilThreshold)
	}
	return scheduling.New(cfg, o)
}
