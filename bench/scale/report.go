// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

func sortResults(rs []result) {
	slices.SortStableFunc(rs, func(a, b result) int {
		if c := strings.Compare(a.Plan, b.Plan); c != 0 {
			return c
		}
		return a.Pools - b.Pools
	})
}

// row is one figure of the report with how to read it from a result.
type row struct {
	name  string
	value func(result) float64
	unit  string
}

var rows = []row{
	{"poolpicker RSS", func(r result) float64 { return mib(r.RSS) }, "MiB"},
	{"poolpicker peak RSS", func(r result) float64 { return mib(r.PeakRSS) }, "MiB"},
	{"poolpicker heap in use", func(r result) float64 { return r.HeapInuse / (1 << 20) }, "MiB"},
	{"poolpicker goroutines", func(r result) float64 { return r.Goroutines }, ""},
	{"poolpicker CPU idle", func(r result) float64 { return r.IdleCPU }, "cores"},
	{"idle scrapes", func(r result) float64 { return r.IdleScrapesSec }, "/s"},
	{"model servers CPU idle", func(r result) float64 { return r.ServersIdleCPU }, "cores"},
	{"poolpicker CPU, hot traffic", func(r result) float64 { return r.HotCPU }, "cores"},
	{"hot picks", func(r result) float64 { return r.HotPickRate }, "/s"},
	{"hot pick p99", func(r result) float64 { return r.HotPickP99Ms }, "ms"},
	{"metric age p50 (hot picks)", func(r result) float64 { return r.MetricAgeP50Ms }, "ms"},
	{"metric age p99 (hot picks)", func(r result) float64 { return r.MetricAgeP99Ms }, "ms"},
	{"longest busy interval the budget allows", func(r result) float64 { return r.BusyIntervalMs }, "ms"},
	{"scrape CPU (budget's mean)", func(r result) float64 { return r.CPUPerScrapeUs }, "µs"},
	{"hanging neighbour: metric age p99 / quiet", neighbourRatio(0, true), "x"},
	{"hanging neighbour: hot pick p99 / quiet", neighbourRatio(0, false), "x"},
	{"noisy neighbour's traffic: metric age p99 / quiet", neighbourRatio(1, true), "x"},
	{"noisy neighbour's traffic: hot pick p99 / quiet", neighbourRatio(1, false), "x"},
	{"noisy neighbour's traffic, own gateway: metric age p99 / quiet", neighbourRatio(2, true), "x"},
	{"noisy neighbour's traffic, own gateway: hot pick p99 / quiet", neighbourRatio(2, false), "x"},
	{"noisy neighbour's traffic, interleaved: metric age p99 / quiet slices", neighbourRatio(3, true), "x"},
	{"noisy neighbour's traffic, interleaved: hot pick p99 / quiet slices", neighbourRatio(3, false), "x"},
	{"cold first pick p50", func(r result) float64 { return r.ColdPickP50Ms }, "ms"},
	{"cold first pick p99", func(r result) float64 { return r.ColdPickP99Ms }, "ms"},
	{"cold pool's second pick p50", func(r result) float64 { return r.WarmPickP50Ms }, "ms"},
	{"cold pool's second pick p99", func(r result) float64 { return r.WarmPickP99Ms }, "ms"},
	{"pick after the same pause, pool picked before, p50", func(r result) float64 { return r.IdlePickP50Ms }, "ms"},
	{"pick after the same pause, pool picked before, p99", func(r result) float64 { return r.IdlePickP99Ms }, "ms"},
	{"loopback echo after the same pause, p50", func(r result) float64 { return r.EchoP50Ms }, "ms"},
	{"loopback echo after the same pause, p99", func(r result) float64 { return r.EchoP99Ms }, "ms"},
	{"ext_proc server that answers at once, after the same pause, p50", func(r result) float64 { return r.AtOnceP50Ms }, "ms"},
	{"ext_proc server that answers at once, after the same pause, p99", func(r result) float64 { return r.AtOnceP99Ms }, "ms"},
	{"cold first pick p99 / loopback echo p99", floorRatio(func(r result) float64 { return r.EchoP99Ms }), "x"},
	{"cold first pick p99 / answered at once p99", floorRatio(func(r result) float64 { return r.AtOnceP99Ms }), "x"},
	{"sync from start", func(r result) float64 { return r.SyncSec }, "s"},
	{"poolpicker CPU to sync", func(r result) float64 { return r.PickerSyncCPUSec }, "s"},
	{"API requests at sync per pool", func(r result) float64 { return r.Requests / float64(r.Pools) }, ""},
	{"kube-apiserver steady RSS (objects)", func(r result) float64 { return mib(r.APISteadyRSS) }, "MiB"},
	{"kube-apiserver peak RSS", func(r result) float64 { return mib(r.APIPeakRSS) }, "MiB"},
	{"kube-apiserver added by watches", func(r result) float64 { return mib(r.apiAdded()) }, "MiB"},
	{"kube-apiserver CPU to sync", func(r result) float64 { return r.APISyncCPUSec }, "s"},
	{"kube-apiserver CPU idle", func(r result) float64 { return r.APIIdleCPU }, "cores"},
	{"kube-apiserver CPU, pod updates", func(r result) float64 { return r.APIFlipCPU }, "cores"},
	{"poolpicker CPU, pod updates", func(r result) float64 { return r.FlipPickerCPU }, "cores"},
}

// neighbourRatio reads the other pools' metric age (or pick) p99 with
// noisy neighbour i against its round's quiet window's (an interleaved
// window's against its own quiet slices'), the median over the rounds; 0
// without it.
func neighbourRatio(i int, age bool) func(result) float64 {
	ratio := func(quiet, n hotFigures) float64 {
		if n.QuietSlices != nil {
			quiet = *n.QuietSlices
		}
		if age {
			return n.AgeP99Ms / quiet.AgeP99Ms
		}
		return n.PickP99Ms / quiet.PickP99Ms
	}
	return func(r result) float64 {
		if i >= len(r.Neighbours) {
			return 0
		}
		quiet := hotFigures{AgeP99Ms: r.MetricAgeP99Ms, PickP99Ms: r.HotPickP99Ms}
		ratios := []float64{ratio(quiet, r.Neighbours[i])}
		for _, round := range r.NoisyRounds {
			if i < len(round.Neighbours) {
				ratios = append(ratios, ratio(round.Quiet, round.Neighbours[i]))
			}
		}
		return median(ratios)
	}
}

// floorRatio is the cold first pick's p99 against a floor measured after
// the same pause, 0 for results without it.
func floorRatio(floor func(result) float64) func(result) float64 {
	return func(r result) float64 {
		if floor(r) == 0 {
			return 0
		}
		return r.ColdPickP99Ms / floor(r)
	}
}

// median is the middle of xs (the mean of the two middle ones when their
// number is even).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printReport prints a column per run and, for each run past 1,000 pools,
// its ratio to the 1,000-pool run of the same plan.
func printReport(w io.Writer, rs []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%d pools, %s\t", r.Pools, planName(r.Plan))
	}
	fmt.Fprintln(tw)
	base := func(r result) (result, bool) {
		for _, b := range rs {
			if b.Pools == 1000 && b.Plan == r.Plan && r.Pools != 1000 {
				return b, true
			}
		}
		return result{}, false
	}
	for _, rw := range rows {
		fmt.Fprintf(tw, "%s (%s)\t", rw.name, rw.unit)
		for _, r := range rs {
			v := rw.value(r)
			s := fmt.Sprintf("%.3g", v)
			if v >= 1000 {
				s = fmt.Sprintf("%.0f", v)
			}
			if b, ok := base(r); ok && rw.value(b) != 0 {
				s += fmt.Sprintf(" (%.2fx)", v/rw.value(b))
			}
			fmt.Fprintf(tw, "%s\t", s)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, r := range rs {
		fmt.Fprintf(w, "%d pools, %s: %d pods, %d namespaces, %d model-server processes, hot %d pools at %.0f req/s, pod updates %.0f/s, poolpicker flags %q\n",
			r.Pools, planName(r.Plan), r.Pools*r.Pods, r.Namespaces, r.Servers, r.HotPools, r.HotRate, r.FlipRate, r.PickerArgs)
	}
}

// markdown is the results as the performance page's table: a row per pool
// count and plan, the page's figures as columns.
func markdown(w io.Writer, rs []result) {
	fmt.Fprintln(w, "| pools | plan | RSS MiB | heap MiB | idle CPU | sync s | API requests per pool | API server steady MiB | added MiB | API server CPU to sync s | API server CPU, pod updates | cold pick p50 / p99 ms | hot metric age p50 / p99 ms |")
	fmt.Fprintln(w, "| --: | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
	for _, r := range rs {
		fmt.Fprintf(w, "| %d | %s | %.0f | %.0f | %.2f | %.1f | %.3f | %.0f | %.0f | %.1f | %.3f | %.1f / %.1f | %.0f / %.0f |\n",
			r.Pools, planName(r.Plan), mib(r.RSS), r.HeapInuse/(1<<20), r.IdleCPU, r.SyncSec, r.Requests/float64(r.Pools),
			mib(r.APISteadyRSS), mib(r.apiAdded()), r.APISyncCPUSec, r.APIFlipCPU, r.ColdPickP50Ms, r.ColdPickP99Ms, r.MetricAgeP50Ms, r.MetricAgeP99Ms)
	}
}
