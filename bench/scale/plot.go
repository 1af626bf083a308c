// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/poolpicker/poolpicker/bench/internal/svgplot"
)

// panel is one plotted figure with its goal at 10,000 pools (0: none).
type panel struct {
	title  string
	value  func(result) float64
	target float64
}

var panels = []panel{
	{"poolpicker RSS (MiB)", func(r result) float64 { return mib(r.RSS) }, 2048},
	{"poolpicker CPU idle (cores)", func(r result) float64 { return r.IdleCPU }, 0.5},
	{"sync from start (s)", func(r result) float64 { return r.SyncSec }, 60},
	{"API requests at sync per pool", func(r result) float64 { return r.Requests / float64(r.Pools) }, 1.1},
	{"kube-apiserver memory added (MiB)", func(r result) float64 { return mib(r.apiAdded()) }, 1024},
	{"kube-apiserver CPU, pod updates (cores)", func(r result) float64 { return r.APIFlipCPU }, 0},
	{"cold first pick p99 (ms)", func(r result) float64 { return r.ColdPickP99Ms }, 5},
	{"hot pick metric age p99 (ms)", func(r result) float64 { return r.MetricAgeP99Ms }, 100},
}

// plot draws each panel's figure against the pool count, both on log
// scales, a line per watch plan, the goal as a dashed line.
func plot(rs []result) string {
	const (
		panelW, panelH = 230, 170
		left, top      = 60, 40
		gapX, gapY     = 45, 60
		cols           = 4
		legendH        = 30
	)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"}
	var plans []string
	xlo, xhi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		if !containsString(plans, r.Plan) {
			plans = append(plans, r.Plan)
		}
		xlo, xhi = min(xlo, float64(r.Pools)), max(xhi, float64(r.Pools))
	}
	xlo, xhi = decadeBelow(xlo), decadeAbove(xhi)
	rowsN := (len(panels) + cols - 1) / cols
	width := left + cols*(panelW+gapX)
	height := top + rowsN*(panelH+gapY) + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	xOf := func(v float64) float64 { return panelW * logFrac(v, xlo, xhi) }
	for i, p := range panels {
		ylo, yhi := math.Inf(1), math.Inf(-1)
		for _, r := range rs {
			if v := p.value(r); v > 0 {
				ylo, yhi = min(ylo, v), max(yhi, v)
			}
		}
		if p.target > 0 {
			ylo, yhi = min(ylo, p.target), max(yhi, p.target)
		}
		if math.IsInf(ylo, 1) {
			ylo, yhi = 1, 10
		}
		ylo, yhi = decadeBelow(ylo), decadeAbove(yhi)
		if ylo == yhi {
			yhi *= 10
		}
		yOf := func(v float64) float64 { return panelH * (1 - logFrac(v, ylo, yhi)) }
		ox, oy := left+(i%cols)*(panelW+gapX), top+(i/cols)*(panelH+gapY)
		fmt.Fprintf(&b, `<g transform="translate(%d,%d)">`+"\n", ox, oy)
		fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", panelW, panelH)
		fmt.Fprintf(&b, `<text x="%d" y="-8" text-anchor="middle" font-weight="bold">%s</text>`+"\n", panelW/2, p.title)
		for t := ylo; t <= yhi*1.0001; t *= 10 {
			y := yOf(t)
			fmt.Fprintf(&b, `<line x1="0" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", panelW, y, y)
			fmt.Fprintf(&b, `<text x="-4" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n", y, t)
		}
		for t := xlo; t <= xhi*1.0001; t *= 10 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n", xOf(t), panelH+14, t)
		}
		if p.target > 0 {
			y := yOf(p.target)
			fmt.Fprintf(&b, `<line x1="0" x2="%d" y1="%.1f" y2="%.1f" stroke="#d62728" stroke-dasharray="4 3"/>`+"\n", panelW, y, y)
		}
		for pi, plan := range plans {
			var pts []string
			for _, r := range rs {
				if v := p.value(r); r.Plan == plan && v > 0 {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(float64(r.Pools)), yOf(v)))
				}
			}
			svgplot.Series(&b, pts, colors[pi%len(colors)])
		}
		b.WriteString("</g>\n")
	}
	ly := height - legendH/2
	for pi, plan := range plans {
		x := left + pi*190
		svgplot.LegendEntry(&b, x, ly, colors[pi%len(colors)], planName(plan))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#555">pools (5 pods each), log scales; dashed: the goal at 10,000 pools</text>`+"\n", width-10, ly)
	b.WriteString("</svg>\n")
	return b.String()
}

func logFrac(v, lo, hi float64) float64 {
	f := (math.Log10(max(v, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
	return min(max(f, 0), 1)
}

func decadeBelow(v float64) float64 { return math.Pow(10, math.Floor(math.Log10(v))) }
func decadeAbove(v float64) float64 { return math.Pow(10, math.Ceil(math.Log10(v))) }

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
