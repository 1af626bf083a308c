// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// TestRenamingGatherer: each family of llmdNames is exported under the
// names --metric-names selects, with the same buckets and values, the
// llm-d router's label names, labels in order; other families pass as
// they are.
func TestRenamingGatherer(t *testing.T) {
	reg := prometheus.NewRegistry()
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inference_extension_scheduler_attempts_total", Help: "h"},
		[]string{"status", "target_model_name", "pod_name", "namespace", "port", "pool"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "inference_objective_request_duration_seconds", Help: "h", Buckets: []float64{0.5, 2}},
		[]string{"model_name", "namespace", "pool"})
	own := prometheus.NewGauge(prometheus.GaugeOpts{Name: "poolpicker_served_pools", Help: "h"})
	reg.MustRegister(attempts, duration, own)
	attempts.WithLabelValues("success", "m", "pod-a", "ns", "8000", "p").Add(3)
	duration.WithLabelValues("m", "ns", "p").Observe(1)
	own.Set(7)

	const (
		oldAttempts = `inference_extension_scheduler_attempts_total{namespace="ns",pod_name="pod-a",pool="p",port="8000",status="success",target_model_name="m"} 3`
		newAttempts = `llm_d_epp_scheduler_attempts_total{endpoint_name="pod-a",namespace="ns",pool="p",port="8000",status="success",target_model_name="m"} 3`
		oldBucket   = `inference_objective_request_duration_seconds_bucket{model_name="m",namespace="ns",pool="p",le="2"} 1`
		newBucket   = `llm_d_epp_request_duration_seconds_bucket{model_name="m",namespace="ns",pool="p",le="2"} 1`
		ownSeries   = "poolpicker_served_pools 7"
	)
	for _, tc := range []struct {
		flag      string
		want, not []string
	}{
		{"inference,llm-d", []string{oldAttempts, newAttempts, oldBucket, newBucket, ownSeries}, nil},
		{"inference", []string{oldAttempts, oldBucket, ownSeries}, []string{"llm_d_epp_"}},
		{"llm-d", []string{newAttempts, newBucket, ownSeries}, []string{"inference_"}},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			var o options
			if err := newFlagSet(io.Discard, &o).Parse([]string{"--metric-names=" + tc.flag}); err != nil {
				t.Fatal(err)
			}
			g := renamingGatherer{g: reg, names: o.metricNames}
			// The families must also pass client_golang's consistency
			// checks (no duplicate families or series).
			if _, err := (prometheus.Gatherers{g}).Gather(); err != nil {
				t.Fatal(err)
			}
			page := gatherText(t, g)
			for _, w := range tc.want {
				if !strings.Contains(page, w+"\n") {
					t.Errorf("no %s in\n%s", w, page)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(page, n) {
					t.Errorf("%s exported with --metric-names=%s:\n%s", n, tc.flag, page)
				}
			}
		})
	}
}

func TestMetricNamesFlag(t *testing.T) {
	for _, tc := range []struct {
		arg     string
		wantErr string
		want    metricNames
	}{
		{arg: "", want: metricNames{inference: true, llmd: true}},
		{arg: "--metric-names=llm-d,inference", want: metricNames{inference: true, llmd: true}},
		{arg: "--metric-names=llm-d", want: metricNames{llmd: true}},
		{arg: "--metric-names=", wantErr: "name at least one of inference and llm-d"},
		{arg: "--metric-names=llm_d_epp", wantErr: `unknown metric name family "llm_d_epp"`},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			var o options
			var args []string
			if tc.arg != "" {
				args = []string{tc.arg}
			}
			err := newFlagSet(io.Discard, &o).Parse(args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || o.metricNames != tc.want {
				t.Fatalf("%+v, %v; want %+v", o.metricNames, err, tc.want)
			}
		})
	}
}

// gatherText renders what g gathers in the text exposition format.
func gatherText(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
