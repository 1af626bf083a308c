// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pickerBinary is cmd/poolpicker, built once by TestMain: a build takes what
// it takes on a cold cache, outside the test's deadline.
var pickerBinary string

func TestMain(m *testing.M) {
	// The harness starts its model servers and a noisy neighbour's gateway
	// as copies of its own binary.
	if served, err := serveRole(); served {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(func() int {
		bin, cleanup, err := buildPicker(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		pickerBinary = bin
		return m.Run()
	}())
}

// TestSmallRun runs the whole harness at 20 pools: a real API server, the
// poolpicker binary, model servers on loopback addresses and ext_proc
// traffic, and checks that every figure of the report was measured.
func TestSmallRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two control planes and the poolpicker binary")
	}
	if err := raiseFileLimit(); err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := pickerBinary
	c := config{Pools: 20, Pods: 3, Namespaces: 2, HotShare: 0.1, HotRate: 50, FlipRate: 10, Servers: 2, Port: port,
		settle: 2 * time.Second, idleWindow: 2 * time.Second, hotWindow: 3 * time.Second, flipWindow: 2 * time.Second,
		coldPicks: 5, snapshots: t.TempDir(), steadyWait: time.Second, hotWarmup: time.Second, Noisy: 50, NoisyRounds: 2, NoisyOwnGateway: true, NoisyInterleave: 500 * time.Millisecond,
		// An idle server is scraped once at start, then every idle interval:
		// at the default 30 s the 2 s idle window would see none.
		PickerArgs: "--idle-refresh-metrics-interval=1s"}
	r, err := runOne(ctx, c, bin)
	if err != nil {
		t.Fatal(err)
	}
	positive := map[string]float64{
		"sync": r.SyncSec, "populate": r.PopulateSec, "requests": r.Requests, "RSS": float64(r.RSS), "peak RSS": float64(r.PeakRSS),
		"heap": r.HeapInuse, "goroutines": r.Goroutines, "idle scrapes": r.IdleScrapesSec, "hot CPU": r.HotCPU,
		"hot picks": float64(r.HotPicks), "metric age p50": r.MetricAgeP50Ms, "cold pick p50": r.ColdPickP50Ms, "second pick p50": r.WarmPickP50Ms, "pick after a pause p50": r.IdlePickP50Ms, "loopback echo p50": r.EchoP50Ms, "loopback echo p99": r.EchoP99Ms, "answered at once p50": r.AtOnceP50Ms, "answered at once p99": r.AtOnceP99Ms,
		"API server steady RSS": float64(r.APISteadyRSS), "API server peak RSS": float64(r.APIPeakRSS),
		"API server CPU to sync": r.APISyncCPUSec, "API server CPU under pod updates": r.APIFlipCPU,
	}
	for name, v := range positive {
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	// The noisy-neighbour windows: one pool's servers hung (its scrapes
	// timed out), then its traffic at 50x, sent by the timing client, by a
	// gateway process of its own, and in every other slice of a window;
	// the other pool was measured in each.
	if len(r.Neighbours) != 4 {
		t.Fatalf("%d noisy-neighbour windows, want 4", len(r.Neighbours))
	}
	if hang := r.Neighbours[0]; hang.ScrapeTimeouts < 1 || hang.Picks == 0 || !(hang.AgeP99Ms > 0) {
		t.Errorf("hanging neighbour: %+v, want timed-out scrapes and the other pool's picks", hang)
	}
	if loud := r.Neighbours[1]; loud.Picks <= r.HotPicks || !(loud.AgeP99Ms > 0) {
		t.Errorf("50x neighbour: %d picks against %d quiet, want more; %+v", loud.Picks, r.HotPicks, loud)
	}
	// Its own gateway's picks were each routed to one of its pool's pods
	// (the process fails otherwise) and are counted with the timing
	// client's, which measured the other pool.
	if own := r.Neighbours[2]; own.NeighbourPicks == 0 || own.Picks <= r.HotPicks || own.Picks == own.NeighbourPicks || !(own.NeighbourCPU > 0) || !(own.AgeP99Ms > 0) {
		t.Errorf("50x neighbour from its own gateway: %d of %d picks theirs against %d quiet, want some of more; %+v", own.NeighbourPicks, own.Picks, r.HotPicks, own)
	}
	if loud := r.Neighbours[1]; loud.NeighbourPicks != 0 {
		t.Errorf("50x neighbour through the timing client: %d picks counted as its own gateway's", loud.NeighbourPicks)
	}
	// The interleaved window: the neighbour at 50x in every other slice
	// and as the other pool in the rest, the other pool measured in both,
	// and its ratio against its own quiet slices.
	mixed := r.Neighbours[3]
	if q := mixed.QuietSlices; q == nil || q.NeighbourPicks == 0 || mixed.NeighbourPicks < 5*q.NeighbourPicks || q.Picks <= q.NeighbourPicks || !(q.PickP99Ms > 0) || !(mixed.PickP99Ms > 0) {
		t.Errorf("interleaved window: %+v, want the neighbour's picks at 50x in its loud slices and the other pool measured in both", mixed)
	} else if got, want := neighbourRatio(3, false)(result{Neighbours: r.Neighbours}), mixed.PickP99Ms/q.PickP99Ms; got != want {
		t.Errorf("interleaved pick ratio %v, want the loud slices' p99 over the quiet ones' %v", got, want)
	}
	// The second round: its own quiet window and all four noisy ones, and the
	// reported ratio the median (here the mean) of the two rounds'.
	if len(r.NoisyRounds) != 1 || len(r.NoisyRounds[0].Neighbours) != 4 {
		t.Fatalf("noisy rounds past the first: %+v, want one of four windows", r.NoisyRounds)
	}
	round := r.NoisyRounds[0]
	if round.Quiet.Picks == 0 || round.Neighbours[0].ScrapeTimeouts < 1 || round.Neighbours[1].Picks <= round.Quiet.Picks {
		t.Errorf("second round: quiet %d picks, hanging %.0f timeouts, 50x %d picks", round.Quiet.Picks, round.Neighbours[0].ScrapeTimeouts, round.Neighbours[1].Picks)
	}
	want := (r.Neighbours[1].AgeP99Ms/r.MetricAgeP99Ms + round.Neighbours[1].AgeP99Ms/round.Quiet.AgeP99Ms) / 2
	if got := neighbourRatio(1, true)(r); math.Abs(got-want) > 1e-9 {
		t.Errorf("50x neighbour's metric age ratio %v, want the rounds' mean %v", got, want)
	}
	if r.HotPools != 2 || r.ColdPicks != 5 {
		t.Errorf("hot pools %d, cold picks %d; want 2 and 5", r.HotPools, r.ColdPicks)
	}
	// Every pool's pods are listed at least once; the rest is a fixed few
	// (permission checks, the pool and policy kinds).
	if r.Requests < float64(c.Pools)/float64(c.Namespaces) || r.Requests > 3*float64(c.Pools)+40 {
		t.Errorf("%v API requests at sync for %d pools", r.Requests, c.Pools)
	}
	// Hot picks see values scraped at the refresh interval, well inside the
	// staleness threshold (2 s), however loaded the machine.
	if r.MetricAgeP99Ms > 2000 || r.MetricAgeP50Ms > r.MetricAgeP99Ms {
		t.Errorf("metric age p50 %v ms, p99 %v ms", r.MetricAgeP50Ms, r.MetricAgeP99Ms)
	}
	if r.APIPeakRSS < r.APISteadyRSS || r.PeakRSS < r.RSS {
		t.Errorf("peaks below steady values: API server %d < %d or poolpicker %d < %d", r.APIPeakRSS, r.APISteadyRSS, r.PeakRSS, r.RSS)
	}

	// The report, the merge into a results file and the plot.
	out := filepath.Join(t.TempDir(), "results.json")
	for _, pools := range []int{20, 10, 20} {
		rr := r
		rr.Pools = pools
		if err := mergeResults(out, rr); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := readResults(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Pools != 10 || rs[1].Pools != 20 {
		t.Fatalf("merged results: %d runs, want the 10- and 20-pool runs in order", len(rs))
	}
	var b strings.Builder
	printReport(&b, rs)
	if !strings.Contains(b.String(), "cold first pick p99") || !strings.Contains(b.String(), "20 pools, default plan") {
		t.Errorf("report:\n%s", b.String())
	}
	b.Reset()
	markdown(&b, rs)
	if got := strings.Count(b.String(), "\n"); got != 2+len(rs) {
		t.Errorf("markdown table has %d lines for %d runs:\n%s", got, len(rs), b.String())
	}
	if svg := plot(rs); !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != len(panels) {
		t.Errorf("plot has %d lines for %d panels", strings.Count(svg, "<polyline"), len(panels))
	}
}

func TestPodAddr(t *testing.T) {
	for _, n := range []int{0, 1, 253, 254, 50_000, maxAddresses - 1} {
		ip := podAddr(n)
		if ip[len(ip)-1] == 0 || ip[len(ip)-1] == 255 {
			t.Errorf("pod %d at %s", n, ip)
		}
		if got, ok := podIndex(ip); !ok || got != n {
			t.Errorf("podIndex(%s) = %d, %v; want %d", ip, got, ok, n)
		}
	}
	for _, s := range []string{"127.0.0.1", "127.100.0.5", "127.100.5.255", "10.100.1.1"} {
		if _, ok := podIndex(net.ParseIP(s)); ok {
			t.Errorf("podIndex(%s) accepted", s)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1}, 2},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}
