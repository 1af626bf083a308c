// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command refplot draws the performance page's comparison of poolpicker with
// the reference EPP, and writes its table, from bench/routing's committed
// results of that comparison (reference-results.json).
//
//	go -C bench run ./routing/refplot -svg ../site-src/images/against-reference.svg
//	go -C bench run ./routing/refplot -markdown
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/poolpicker/poolpicker/bench/internal/svgplot"
)

// run is one router's figures at one point of the comparison.
type run struct {
	Groups  int     `json:"groups"`
	Load    int     `json:"load"`
	Seed    int     `json:"seed"`
	Router  string  `json:"router"`
	HitRate float64 `json:"hitRate"`
	TTFTP50 float64 `json:"ttftP50"`
	TTFTP90 float64 `json:"ttftP90"`
	// AgainstReference is poolpicker's run against the reference's at the
	// same point, as the harness computed it from unrounded figures.
	AgainstReference *against `json:"againstReference,omitempty"`
}

// against is a hit-rate difference and TTFT ratios.
type against struct {
	HitRate float64 `json:"hitRate"`
	TTFTP50 float64 `json:"ttftP50"`
	TTFTP90 float64 `json:"ttftP90"`
}

type results struct {
	Note string `json:"note"`
	Runs []run  `json:"runs"`
}

const (
	poolpicker = "poolpicker"
	reference  = "reference-epp"
)

func readResults(data []byte) (results, error) {
	var rs results
	if err := json.Unmarshal(data, &rs); err != nil {
		return rs, fmt.Errorf("results: %w", err)
	}
	if len(rs.Runs) == 0 {
		return rs, errors.New("results hold no runs")
	}
	for _, r := range rs.Runs {
		if r.Router != poolpicker && r.Router != reference {
			return rs, fmt.Errorf("run of router %q: want %s or %s", r.Router, poolpicker, reference)
		}
		if (r.Router == poolpicker) != (r.AgainstReference != nil) {
			return rs, fmt.Errorf("run %+v: poolpicker's runs, and only they, carry againstReference", r)
		}
		if r.Groups < 1 || r.Load < 1 || r.HitRate < 0 || r.HitRate > 1 || r.TTFTP50 <= 0 || r.TTFTP90 < r.TTFTP50 {
			return rs, fmt.Errorf("run %+v: figures out of range", r)
		}
	}
	return rs, nil
}

// find returns the run of router at a point, and whether there is one.
func (rs results) find(router string, groups, load, seed int) (run, bool) {
	i := slices.IndexFunc(rs.Runs, func(r run) bool {
		return r.Router == router && r.Groups == groups && r.Load == load && r.Seed == seed
	})
	if i < 0 {
		return run{}, false
	}
	return rs.Runs[i], true
}

// axes lists the distinct values of one field, in order.
func axes(rs results, field func(run) int) []int {
	var out []int
	for _, r := range rs.Runs {
		if !slices.Contains(out, field(r)) {
			out = append(out, field(r))
		}
	}
	slices.Sort(out)
	return out
}

// markdown writes the page's table: a row per point and seed, each router's
// hit rate · TTFT p50 · TTFT p90, then poolpicker against the reference.
func markdown(w io.Writer, rs results) error {
	var b strings.Builder
	b.WriteString("| G | load | seed | poolpicker | reference EPP | against the reference |\n")
	b.WriteString("| --: | --: | --: | --- | --- | --- |\n")
	for _, g := range axes(rs, func(r run) int { return r.Groups }) {
		for _, l := range axes(rs, func(r run) int { return r.Load }) {
			for _, s := range axes(rs, func(r run) int { return r.Seed }) {
				p, okP := rs.find(poolpicker, g, l, s)
				r, okR := rs.find(reference, g, l, s)
				if !okP || !okR {
					continue
				}
				a := p.AgainstReference
				fmt.Fprintf(&b, "| %d | %d %% | %d | %s | %s | %s · %.2f× · %.2f× |\n", g, l, s, cell(p), cell(r),
					signed(a.HitRate), a.TTFTP50, a.TTFTP90)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cell(r run) string { return fmt.Sprintf("%.3f · %.2f · %.2f", r.HitRate, r.TTFTP50, r.TTFTP90) }

// signed writes a difference with its sign, a true minus for negatives.
func signed(d float64) string {
	if math.Abs(d) < 0.0005 {
		d = 0
	}
	if d < 0 {
		return fmt.Sprintf("−%.3f", -d)
	}
	return fmt.Sprintf("+%.3f", d)
}

// plot draws a column per prefix count and a row each for TTFT p50 (log
// scale) and hit rate against offered load: a line per router through the
// mean of the seeds, a dot per seed.
func plot(rs results) string {
	const (
		panelW, panelH = 220, 150
		left, top      = 60, 40
		gapX, gapY     = 30, 50
		legendH        = 30
	)
	colors := map[string]string{poolpicker: "#d62728", reference: "#7f7f7f"}
	type metric struct {
		title  string
		value  func(run) float64
		lo, hi float64
		log    bool
		ticks  []float64
	}
	metrics := []metric{
		{"TTFT p50 (s, log)", func(r run) float64 { return r.TTFTP50 }, 0.01, 100, true, []float64{0.01, 0.1, 1, 10, 100}},
		{"TTFT p90 (s, log)", func(r run) float64 { return r.TTFTP90 }, 0.01, 100, true, []float64{0.01, 0.1, 1, 10, 100}},
		{"prefix-cache hit rate", func(r run) float64 { return r.HitRate }, 0, 1, false, []float64{0, 0.25, 0.5, 0.75, 1}},
	}
	groups := axes(rs, func(r run) int { return r.Groups })
	loads := axes(rs, func(r run) int { return r.Load })
	seeds := axes(rs, func(r run) int { return r.Seed })
	width := left + len(groups)*(panelW+gapX)
	height := top + len(metrics)*(panelH+gapY) + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
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
			x0 := left + col*(panelW+gapX)
			y0 := top + row*(panelH+gapY)
			fmt.Fprintf(&b, `<g transform="translate(%d,%d)">`+"\n", x0, y0)
			fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", panelW, panelH)
			fmt.Fprintf(&b, `<text x="%d" y="-8" text-anchor="middle" font-weight="bold">%d prefixes: %s</text>`+"\n", panelW/2, g, m.title)
			for _, tk := range m.ticks {
				fmt.Fprintf(&b, `<text x="-4" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n", yOf(tk), tk)
			}
			for i, l := range loads {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d%%</text>`+"\n", xOf(i), panelH+14, l)
			}
			for _, router := range []string{reference, poolpicker} {
				var line []string
				for i, l := range loads {
					var sum float64
					var n int
					for _, s := range seeds {
						if r, ok := rs.find(router, g, l, s); ok {
							sum += m.value(r)
							n++
							fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="none" stroke="%s"/>`+"\n", xOf(i), yOf(m.value(r)), colors[router])
						}
					}
					if n > 0 {
						line = append(line, fmt.Sprintf("%.1f,%.1f", xOf(i), yOf(sum/float64(n))))
					}
				}
				svgplot.Series(&b, line, colors[router])
			}
			b.WriteString("</g>\n")
		}
	}
	ly := height - legendH/2
	svgplot.LegendEntry(&b, left, ly, colors[poolpicker], "poolpicker (default profile, one replica)")
	svgplot.LegendEntry(&b, left+300, ly, colors[reference], "reference EPP v1.5.0; x: offered load, line: mean of the seeds")
	b.WriteString("</svg>\n")
	return b.String()
}

func main() {
	in := flag.String("results", filepath.Join("routing", "reference-results.json"), "The comparison's results (relative to bench/).")
	svg := flag.String("svg", "", "Write the plot to this file.")
	md := flag.Bool("markdown", false, "Print the performance page's table.")
	flag.Parse()
	if err := mainErr(os.Stdout, *in, *svg, *md); err != nil {
		fmt.Fprintln(os.Stderr, "refplot:", err)
		os.Exit(1)
	}
}

func mainErr(w io.Writer, in, svg string, md bool) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	rs, err := readResults(data)
	if err != nil {
		return err
	}
	if md {
		if err := markdown(w, rs); err != nil {
			return err
		}
	}
	if svg != "" {
		return os.WriteFile(svg, []byte(plot(rs)), 0o644)
	}
	return nil
}
