// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The full mode's statistic. Tenant B's p99 over one window moves with
// the load of the machine the suite shares, by more than the 1.2x the
// suite allows, and that load drifts over seconds to minutes. So the full
// mode measures each case as pairs of adjacent short windows, one with
// tenant A's misbehaviour and one without, and compares within each pair:
//
//   - a pair's two windows are seconds apart, so a drift of the load
//     shifts both alike and cancels in their ratio;
//   - the order alternates, without first in odd pairs and with first in
//     even ones, so a trend within a pair favours neither side;
//   - the median of the pairs' ratios moves only if more than half the
//     pairs are affected, so a burst of load in one window (either one)
//     cannot decide the result;
//   - with no harm, a pair's ratio is as likely above 1 as below, so the
//     number of pairs where B fared worse with the misbehaviour is a sign
//     test, reported beside the median: 9 of 9 happens by chance once in
//     512 runs, 8 or more of 9 in 10 of 512.
//
// A case fails when the median paired ratio of B's pick p99 or metric age
// p99 is over 1.2 and the median paired difference is over the
// measurement's resolution (pickNoise, ageNoise).
var pairs = flag.Int("isolation.pairs", 9, "full mode: pairs of windows per case, one with tenant A's misbehaviour and one without, their order alternating")

// fullWindowRequests is how many requests of tenant B one window of the
// full mode lasts (about a second at the suite's rate; longer while
// tenant A's action settles).
const fullWindowRequests = 1000

// Below these differences a ratio is resolution, not harm: a pick's p99 is
// a few milliseconds of timer and scheduler granularity, and a metric age
// moves in steps of the refresh period.
const (
	pickNoise = 5 * time.Millisecond
	ageNoise  = 100 * time.Millisecond
)

// pair is one window without the misbehaviour and the one next to it with.
type pair struct{ without, with window }

// paired is a case's pairs.
type paired struct {
	c     misbehaviour
	pairs []pair
}

// runPairs measures c as *pairs pairs of windows, checking each window
// with the misbehaviour as the short mode does.
func runPairs(t *testing.T, c misbehaviour, perWindow int) paired {
	t.Helper()
	r := paired{c: c}
	refName := c.refName
	if refName == "" {
		refName = "tenant B alone"
	}
	for i := range *pairs {
		var p pair
		for j := range 2 {
			if (i+j)%2 == 0 {
				p.without = measure(t, fmt.Sprintf("%s (pair %d)", refName, i+1), perWindow, c.reference)
				continue
			}
			p.with = measure(t, fmt.Sprintf("%s (pair %d)", c.name, i+1), perWindow, c.start)
			assertUnharmed(t, p.with)
			if c.check != nil {
				c.check(t, p.with)
			}
		}
		t.Logf("pair %d: pick p99 %.2fx, metric age p99 %.2fx", i+1, ratio(p.with.pickP99, p.without.pickP99), ratio(p.with.ageP99, p.without.ageP99))
		r.pairs = append(r.pairs, p)
	}
	return r
}

// stat is the paired statistic of one figure of a case.
type stat struct {
	without, with time.Duration // the medians over the pairs' windows
	ratio         float64       // the median of the pairs' ratios
	diff          time.Duration // the median of the pairs' differences
	worse         int           // pairs where the window with was worse
}

func (r paired) stat(of func(window) time.Duration) stat {
	var without, with, diffs []time.Duration
	var ratios []float64
	var s stat
	for _, p := range r.pairs {
		a, b := of(p.without), of(p.with)
		without, with = append(without, a), append(with, b)
		ratios = append(ratios, ratio(b, a))
		diffs = append(diffs, b-a)
		if b > a {
			s.worse++
		}
	}
	s.without, s.with, s.ratio, s.diff = median(without), median(with), median(ratios), median(diffs)
	return s
}

func pickOf(w window) time.Duration { return w.pickP99 }
func ageOf(w window) time.Duration  { return w.ageP99 }

// served is the fraction of tenant B's requests served by its servers
// over the windows with the misbehaviour.
func (r paired) served() float64 {
	var served, all int
	for _, p := range r.pairs {
		served, all = served+p.with.servedByB, all+p.with.requests
	}
	if all == 0 {
		return 0
	}
	return float64(served) / float64(all)
}

// peakRSS is the largest resident memory of a replica over the windows
// with the misbehaviour.
func (r paired) peakRSS() int64 {
	var peak int64
	for _, p := range r.pairs {
		peak = max(peak, p.with.peakRSS)
	}
	return peak
}

func assertWithinReference(t *testing.T, r paired) {
	t.Helper()
	for _, f := range []struct {
		name  string
		of    func(window) time.Duration
		noise time.Duration
	}{{"pick p99", pickOf, pickNoise}, {"metric age p99", ageOf, ageNoise}} {
		s := r.stat(f.of)
		if s.ratio > 1.2 && s.diff > f.noise {
			t.Errorf("%s: tenant B's %s %.2fx without the misbehaviour, the median over %d pairs (at most 1.2x; %s against %s, worse in %d pairs)",
				r.c.name, f.name, s.ratio, len(r.pairs), s.with, s.without, s.worse)
		}
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func median[T time.Duration | float64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report logs tenant B's paired figures of every case.
func report(t *testing.T, base window, rs []paired) {
	var b strings.Builder
	fmt.Fprintf(&b, "tenant B while tenant A misbehaves: medians over the pairs of windows with and without, and the median of the pairs' ratios (baseline: pick p99 %s, metric age p99 %s):\n",
		base.pickP99.Round(10*time.Microsecond), base.ageP99.Round(time.Millisecond))
	fmt.Fprintf(&b, "| case | without | pairs | B served | pick p99 without / with | ratio (difference) | worse | metric age p99 without / with | ratio (difference) | worse | peak RSS of the limit |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		ref := r.c.refName
		if ref == "" {
			ref = "B alone"
		}
		pick, age := r.stat(pickOf), r.stat(ageOf)
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f %% | %s / %s | %.2f (%s) | %d | %s / %s | %.2f (%s) | %d | %d MiB, %.2f |\n", r.c.name, ref, len(r.pairs), 100*r.served(),
			pick.without.Round(10*time.Microsecond), pick.with.Round(10*time.Microsecond), pick.ratio, pick.diff.Round(10*time.Microsecond), pick.worse,
			age.without.Round(time.Millisecond), age.with.Round(time.Millisecond), age.ratio, age.diff.Round(time.Millisecond), age.worse,
			r.peakRSS()>>20, float64(r.peakRSS())/float64(memoryLimit))
	}
	t.Log(b.String())
}
