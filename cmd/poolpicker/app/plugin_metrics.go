// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/scheduling"
)

// newPluginDurations registers upstream's inference_extension_plugin_duration_seconds
// (its name, buckets and labels) on reg and returns the scheduler's
// Options.PluginDuration, which binds each plugin's series once.
func newPluginDurations(reg prometheus.Registerer) (func(string, scheduling.TypedName) func(time.Duration), error) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "inference_extension_plugin_duration_seconds",
		Help:    "Time each scheduling plugin call took, by extension point (Filter, Scorer, Picker), plugin type and plugin name.",
		Buckets: []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1},
	}, []string{"extension_point", "plugin_type", "plugin_name"})
	if err := reg.Register(h); err != nil {
		return nil, err
	}
	return func(extensionPoint string, p scheduling.TypedName) func(time.Duration) {
		o := h.WithLabelValues(extensionPoint, p.Type, p.Name)
		return func(d time.Duration) { o.Observe(d.Seconds()) }
	}, nil
}
