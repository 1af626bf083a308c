// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/poolpicker/poolpicker/bench/internal/svgplot"
)

// plot draws the sweep as an SVG: one column of panels per G, rows of TTFT
// p50 (log scale), hit rate, critical requests' TTFT p90 and the share of
// sheddable requests answered 429, offered load across, a line per router.
func plot(rs []result, groups []int, routers []router) string {
	const (
		panelW, panelH = 220, 170
		left, top      = 60, 40
		gapX, gapY     = 30, 50
		legendH        = 30
	)
	colors := []string{"#d62728", "#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"}
	type metric struct {
		title string
		value func(result) float64
		lo    float64
		hi    float64
		log   bool
		ticks []float64
	}
	metrics := []metric{
		{"TTFT p50 (s, log)", func(r result) float64 { return r.ttft50.Seconds() }, 0.01, 100, true, []float64{0.01, 0.1, 1, 10, 100}},
		{"prefix-cache hit rate", func(r result) float64 { return r.hitRate }, 0, 1, false, []float64{0, 0.25, 0.5, 0.75, 1}},
		{"critical TTFT p90 (s, log)", func(r result) float64 { return r.critTTFT90.Seconds() }, 0.01, 100, true, []float64{0.01, 0.1, 1, 10, 100}},
		{"sheddable answered 429", func(r result) float64 { return float64(r.shed) / float64(max(r.sheddable, 1)) }, 0, 1, false, []float64{0, 0.25, 0.5, 0.75, 1}},
	}
	width := left + len(groups)*(panelW+gapX)
	height := top + len(metrics)*(panelH+gapY) + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)

	var loads []float64
	for _, r := range rs {
		if !containsFloat(loads, r.load) {
			loads = append(loads, r.load)
		}
	}
	xOf := func(i int) float64 {
		if len(loads) == 1 {
			return panelW / 2
		}
		return 15 + float64(i)*(panelW-30)/float64(len(loads)-1)
	}
	for row, m := range metrics {
		yOf := func(v float64) float64 {
			f := (v - m.lo) / (m.hi - m.lo)
			if m.log {
				f = (math.Log10(max(v, m.lo)) - math.Log10(m.lo)) / (math.Log10(m.hi) - math.Log10(m.lo))
			}
			return panelH * (1 - min(max(f, 0), 1))
		}
		for col, g := range groups {
			ox, oy := left+col*(panelW+gapX), top+row*(panelH+gapY)
			fmt.Fprintf(&b, `<g transform="translate(%d,%d)">`+"\n", ox, oy)
			fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", panelW, panelH)
			fmt.Fprintf(&b, `<text x="%d" y="-8" text-anchor="middle" font-weight="bold">G = %d: %s</text>`+"\n", panelW/2, g, m.title)
			for _, t := range m.ticks {
				y := yOf(t)
				fmt.Fprintf(&b, `<line x1="0" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", panelW, y, y)
				if col == 0 {
					fmt.Fprintf(&b, `<text x="-4" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n", y, t)
				}
			}
			for i, l := range loads {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f%%</text>`+"\n", xOf(i), panelH+14, l*100)
			}
			for ri, rt := range routers {
				var pts []string
				for i, l := range loads {
					for _, r := range rs {
						if r.groups == g && r.load == l && r.series() == rt.name {
							pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(i), yOf(m.value(r))))
						}
					}
				}
				svgplot.Series(&b, pts, colors[ri%len(colors)])
			}
			b.WriteString("</g>\n")
		}
	}
	ly := height - legendH/2
	for ri, rt := range routers {
		x := left + ri*170
		svgplot.LegendEntry(&b, x, ly, colors[ri%len(colors)], rt.name)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#555">offered load, %% of capacity at full hit rate</text>`+"\n", width-10, ly)
	b.WriteString("</svg>\n")
	return b.String()
}

func containsFloat(s []float64, v float64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
