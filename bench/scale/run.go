// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/bench/internal/proc"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// result is one run's report. Sizes are bytes, CPU is in cores (CPU
// seconds per second) unless named seconds, times are seconds.
type result struct {
	config
	Date        string  `json:"date"`
	PopulateSec float64 `json:"populateSeconds,omitempty"`

	SyncSec          float64            `json:"syncSeconds"`
	PickerSyncCPUSec float64            `json:"pickerSyncCPUSeconds"`
	Requests         float64            `json:"requestsAtSync"`
	RequestsByMethod map[string]float64 `json:"requestsAtSyncByMethod"`

	RSS        int64   `json:"pickerRSS"`
	PeakRSS    int64   `json:"pickerPeakRSS"`
	HeapInuse  float64 `json:"pickerHeapInuse"`
	Goroutines float64 `json:"pickerGoroutines"`

	IdleCPU        float64 `json:"pickerIdleCPU"`
	IdleScrapesSec float64 `json:"idleScrapesPerSecond"`
	ServersIdleCPU float64 `json:"serversIdleCPU"`
	HotCPU         float64 `json:"pickerHotCPU"`
	HotClientCPU   float64 `json:"clientHotCPU,omitempty"`
	HotPools       int     `json:"hotPools"`
	HotPicks       int     `json:"hotPicks"`
	HotPickRate    float64 `json:"hotPicksPerSecond"`
	HotPickP50Ms   float64 `json:"hotPickP50Ms"`
	HotPickP99Ms   float64 `json:"hotPickP99Ms"`
	MetricAgeP50Ms float64 `json:"metricAgeP50Ms"`
	MetricAgeP99Ms float64 `json:"metricAgeP99Ms"`
	MetricAgeMaxMs float64 `json:"metricAgeMaxMs"`
	BusyIntervalMs float64 `json:"busyIntervalMaxMs"`
	CPUPerScrapeUs float64 `json:"cpuPerScrapeMicros"`
	// Neighbours are the hot windows with a noisy neighbour (-noisy): the
	// other hot pools' figures with one pool's servers hanging, then with
	// its traffic at Noisy times theirs.
	Neighbours []hotFigures `json:"neighbours,omitempty"`
	// NoisyRounds are the rounds past the first (-noisy-rounds).
	NoisyRounds   []noisyRound `json:"noisyRounds,omitempty"`
	ColdPicks     int          `json:"coldPicks"`
	ColdPickP50Ms float64      `json:"coldPickP50Ms"`
	ColdPickP99Ms float64      `json:"coldPickP99Ms"`
	// WarmPickP50Ms and WarmPickP99Ms are each cold pool's second pick,
	// sent as soon as the first was answered.
	WarmPickP50Ms float64 `json:"warmPickP50Ms"`
	WarmPickP99Ms float64 `json:"warmPickP99Ms"`
	// IdlePickP50Ms and IdlePickP99Ms are picks of pools picked before
	// (cold pools' of the same phase), each after the same pause as a cold
	// pool's first pick: the first pick's baseline for what the pause
	// itself costs (a picker and a client idle for 20 ms wake first).
	IdlePickP50Ms float64 `json:"idlePickP50Ms,omitempty"`
	IdlePickP99Ms float64 `json:"idlePickP99Ms,omitempty"`
	// EchoP50Ms and EchoP99Ms are round trips of one byte between the
	// timing client and an echo server process over loopback, each after
	// the same pause: the machine's floor under a pick after a pause.
	EchoP50Ms float64 `json:"loopbackEchoP50Ms,omitempty"`
	EchoP99Ms float64 `json:"loopbackEchoP99Ms,omitempty"`
	// AtOnceP50Ms and AtOnceP99Ms are the harness's request to an ext_proc
	// server that answers it at once, over the same TLS and gRPC as the
	// picker's, after the same pause: the floor under a pick of this
	// protocol after a pause.
	AtOnceP50Ms   float64 `json:"answeredAtOnceP50Ms,omitempty"`
	AtOnceP99Ms   float64 `json:"answeredAtOnceP99Ms,omitempty"`
	FlipPickerCPU float64 `json:"flipPickerCPU,omitempty"`

	APISteadyRSS   int64   `json:"apiServerSteadyRSS"`
	APIPeakSyncRSS int64   `json:"apiServerPeakRSSToSync"`
	APIPeakRSS     int64   `json:"apiServerPeakRSS"`
	APISyncCPUSec  float64 `json:"apiServerSyncCPUSeconds"`
	APIIdleCPU     float64 `json:"apiServerIdleCPU"`
	APIFlipCPU     float64 `json:"apiServerFlipCPU,omitempty"`
	APIFlipPeakRSS int64   `json:"apiServerFlipPeakRSS,omitempty"`
}

// apiAdded is the API server memory poolpicker's watches added: its peak
// with them less its steady RSS with the objects alone.
func (r result) apiAdded() int64 { return r.APIPeakRSS - r.APISteadyRSS }

// peakSampler follows the most resident memory of some processes.
type peakSampler struct {
	mu    sync.Mutex
	pids  []int
	peaks []int64
	stop  chan struct{}
	done  chan struct{}
}

func samplePeaks(pids ...int) *peakSampler {
	s := &peakSampler{pids: pids, peaks: make([]int64, len(pids)), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			s.mu.Lock()
			for i, p := range s.pids {
				s.peaks[i] = max(s.peaks[i], proc.RSS(p))
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// peak returns the most seen of process i since the last reset, and resets it.
func (s *peakSampler) peak(i int, reset bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := max(s.peaks[i], proc.RSS(s.pids[i]))
	if reset {
		s.peaks[i] = 0
	}
	return v
}

func (s *peakSampler) close() {
	close(s.stop)
	<-s.done
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func runOne(ctx context.Context, c config, bin string) (result, error) {
	r := result{config: c, Date: time.Now().UTC().Format(time.RFC3339)}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s %d pools %s: %s\n", time.Now().Format("15:04:05"), c.Pools, planName(c.Plan), fmt.Sprintf(format, args...))
	}
	snap, took, err := ensureSnapshot(ctx, c, bin)
	if err != nil {
		return r, err
	}
	if took > 0 {
		r.PopulateSec = took.Seconds()
		logf("populated %d pods and %d pools in %s", c.Pools*c.Pods, c.Pools, took.Round(time.Second))
	}
	env, stopCluster, err := startCluster(ctx, snap)
	if err != nil {
		return r, err
	}
	defer stopCluster()
	api := proc.Child(os.Getpid(), "kube-apiserver")
	if api == 0 {
		return r, fmt.Errorf("kube-apiserver child not found")
	}
	// The objects alone: the API server's RSS once its caches are built and
	// it has settled (the most seen over the last few seconds).
	if err := sleep(ctx, c.steadyWait); err != nil {
		return r, err
	}
	for range 25 {
		r.APISteadyRSS = max(r.APISteadyRSS, proc.RSS(api))
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return r, err
		}
	}
	logf("kube-apiserver steady with the objects: %.0f MiB", mib(r.APISteadyRSS))

	dir, err := os.MkdirTemp("", "scale")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(env.Config, kubeconfig); err != nil {
		return r, err
	}
	servers, err := startModelServers(ctx, c.Servers, c.Port, c.BackgroundNice)
	if err != nil {
		return r, err
	}
	defer servers.stop()

	apiCPU0 := proc.CPU(api)
	p, err := startPicker(ctx, bin, kubeconfig, c)
	if err != nil {
		return r, err
	}
	defer p.stop()
	peaks := samplePeaks(api, p.pid())
	defer peaks.close()
	syncProf := make(chan error, 1)
	if c.profiles != "" {
		// The first 30 s from start: the initial sync.
		go func() {
			syncProf <- p.saveProfileFromStart(ctx, "profile?seconds=30", fmt.Sprintf("%s.cpu-sync.%d%s", c.profiles, c.Pools, planSuffix(c.Plan)))
		}()
	} else {
		syncProf <- nil
	}
	sync, err := p.waitReady(ctx, 15*time.Minute)
	if err != nil {
		return r, err
	}
	if err := <-syncProf; err != nil {
		return r, err
	}
	r.SyncSec = sync.Seconds()
	r.APISyncCPUSec = proc.CPU(api) - apiCPU0
	r.PickerSyncCPUSec = proc.CPU(p.pid())
	r.APIPeakSyncRSS = peaks.peak(0, false)
	if c.BackgroundNice != 0 {
		// Past the sync, the control plane is another machine's work.
		etcd := proc.Child(os.Getpid(), "etcd")
		if etcd == 0 {
			return r, fmt.Errorf("etcd child not found")
		}
		for _, pid := range []int{api, etcd} {
			if err := proc.Renice(pid, c.BackgroundNice); err != nil {
				return r, err
			}
		}
	}
	m, err := p.readMetrics(ctx)
	if err != nil {
		return r, err
	}
	r.Requests, r.RequestsByMethod = m.requests, m.byMethod
	logf("synced in %.1f s, %.0f API requests (%.2f per pool; by method %v), kube-apiserver peak %.0f MiB", r.SyncSec, r.Requests, r.Requests/float64(c.Pools), r.RequestsByMethod, mib(r.APIPeakSyncRSS))

	// Idle: every server has decayed to the idle interval.
	if err := sleep(ctx, c.settle); err != nil {
		return r, err
	}
	pc, ac, sc := proc.CPU(p.pid()), proc.CPU(api), servers.cpu()
	n0, err := servers.served()
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	if err := sleep(ctx, c.idleWindow); err != nil {
		return r, err
	}
	el := time.Since(t0).Seconds()
	n1, err := servers.served()
	if err != nil {
		return r, err
	}
	r.IdleCPU, r.APIIdleCPU, r.ServersIdleCPU = (proc.CPU(p.pid())-pc)/el, (proc.CPU(api)-ac)/el, (servers.cpu()-sc)/el
	r.IdleScrapesSec = float64(n1-n0) / el
	logf("idle: poolpicker %.3f cores, %.0f scrapes/s; kube-apiserver %.3f cores", r.IdleCPU, r.IdleScrapesSec, r.APIIdleCPU)

	// Hot pools: evenly spread, 1 % by default.
	nHot := max(1, int(float64(c.Pools)*c.HotShare+0.5))
	var hot []int
	isHot := map[int]bool{}
	for k := range nHot {
		i := k * c.Pools / nHot
		hot = append(hot, i)
		isHot[i] = true
	}
	r.HotPools = nHot
	g, err := newGateway(p.grpcAddr)
	if err != nil {
		return r, err
	}
	defer g.close()
	// With noisy-neighbour runs, every hot figure is the other pools': the
	// noisy one, hot[0], is left out of the quiet window too.
	noisy := c.Noisy > 0 && nHot > 1
	hf, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{}, noisy, "hot")
	if err != nil {
		return r, err
	}
	r.HotCPU, r.HotClientCPU, r.HotPicks, r.HotPickRate = hf.CPU, hf.ClientCPU, hf.Picks, hf.PickRate
	r.HotPickP50Ms, r.HotPickP99Ms = hf.PickP50Ms, hf.PickP99Ms
	r.MetricAgeP50Ms, r.MetricAgeP99Ms, r.MetricAgeMaxMs = hf.AgeP50Ms, hf.AgeP99Ms, hf.AgeMaxMs
	r.BusyIntervalMs, r.CPUPerScrapeUs = hf.BusyIntervalMs, hf.CPUPerScrapeUs
	logf("hot: %d pools, %.0f picks/s, poolpicker %.3f cores (the client %.3f), metric age p50 %.0f ms p99 %.0f ms (the budget allows busy pools %.0f ms at %.0f µs a scrape), pick p50 %.2f ms p99 %.1f ms",
		nHot, r.HotPickRate, r.HotCPU, r.HotClientCPU, r.MetricAgeP50Ms, r.MetricAgeP99Ms, r.BusyIntervalMs, r.CPUPerScrapeUs, r.HotPickP50Ms, r.HotPickP99Ms)
	if noisy {
		if r.Neighbours, err = measureNeighbours(ctx, g, p, servers, c, hot, ""); err != nil {
			return r, err
		}
		logNeighbours(logf, hf, r.Neighbours)
		// More rounds, each a quiet window and its two noisy ones: one
		// window's p99 moves by more than the bound from window to window.
		for round := 2; round <= c.NoisyRounds; round++ {
			suffix := strconv.Itoa(round)
			quiet, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{}, true, "hot"+suffix)
			if err != nil {
				return r, err
			}
			ns, err := measureNeighbours(ctx, g, p, servers, c, hot, suffix)
			if err != nil {
				return r, err
			}
			logf("noisy neighbour, round %d: quiet metric age p99 %.0f ms, pick p99 %.1f ms", round, quiet.AgeP99Ms, quiet.PickP99Ms)
			logNeighbours(logf, quiet, ns)
			r.NoisyRounds = append(r.NoisyRounds, noisyRound{Quiet: quiet, Neighbours: ns})
		}
	}

	// Cold pools: never sent a request, idle since start; one first
	// request each, one at a time.
	picked := maps.Clone(isHot)
	var cold, warm, idle, echo, atOnce []float64
	var pickedBefore []int
	probe, err := startEcho(ctx)
	if err != nil {
		return r, err
	}
	defer probe.close()
	profDone := make(chan error, 2)
	for _, s := range []struct{ prefix, kind, what string }{
		{c.profiles, "cpu-cold", "profile?seconds=5"},
		{c.traces, "trace-cold", "trace?seconds=5"},
	} {
		if s.prefix == "" {
			profDone <- nil
			continue
		}
		go func() {
			profDone <- p.saveProfile(ctx, s.what, fmt.Sprintf("%s.%s.%d%s", s.prefix, s.kind, c.Pools, planSuffix(c.Plan)))
		}()
	}
	nCold := min(c.coldPicks, c.Pools-nHot)
	for k := range nCold {
		i := (k*c.Pools/max(nCold, 1) + c.Pools/(2*max(nCold, 1))) % c.Pools
		for picked[i] {
			i = (i + 1) % c.Pools
		}
		picked[i] = true // not twice
		pk, err := g.pick(ctx, c, i)
		if err != nil {
			return r, fmt.Errorf("cold pick: %w", err)
		}
		cold = append(cold, ms(pk.latency))
		// The same-run baseline: the pool's second pick, now warm, on the
		// same machine at the same moment.
		if pk, err = g.pick(ctx, c, i); err != nil {
			return r, fmt.Errorf("warm pick: %w", err)
		}
		warm = append(warm, ms(pk.latency))
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return r, err
		}
		// The baseline of the pause: a pool picked before, after the same
		// pause as a first pick.
		if k > 0 {
			if pk, err = g.pick(ctx, c, pickedBefore[rand.IntN(len(pickedBefore))]); err != nil {
				return r, fmt.Errorf("pick after a pause: %w", err)
			}
			idle = append(idle, ms(pk.latency))
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return r, err
			}
		}
		// The floor under both: a loopback round trip to a process that
		// does nothing but echo, after the same pause.
		rtt, err := probe.roundTrip()
		if err != nil {
			return r, err
		}
		echo = append(echo, ms(rtt))
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return r, err
		}
		if rtt, err = probe.answeredAtOnce(ctx); err != nil {
			return r, err
		}
		atOnce = append(atOnce, ms(rtt))
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return r, err
		}
		pickedBefore = append(pickedBefore, i)
	}
	if err := errors.Join(<-profDone, <-profDone); err != nil {
		return r, err
	}
	r.ColdPicks = len(cold)
	r.ColdPickP50Ms, r.ColdPickP99Ms = percentile(cold, 50), percentile(cold, 99)
	r.WarmPickP50Ms, r.WarmPickP99Ms = percentile(warm, 50), percentile(warm, 99)
	r.IdlePickP50Ms, r.IdlePickP99Ms = percentile(idle, 50), percentile(idle, 99)
	r.EchoP50Ms, r.EchoP99Ms = percentile(echo, 50), percentile(echo, 99)
	r.AtOnceP50Ms, r.AtOnceP99Ms = percentile(atOnce, 50), percentile(atOnce, 99)
	slowest := slices.Clone(cold)
	slices.Sort(slowest)
	logf("cold: %d first picks, p50 %.2f ms p99 %.2f ms (each pool's second pick: p50 %.2f ms p99 %.2f ms; a pool picked before, after the same pause: p50 %.2f ms p99 %.2f ms; a loopback echo after the same pause: p50 %.2f ms p99 %.2f ms; an ext_proc server that answers at once, after the same pause: p50 %.2f ms p99 %.2f ms); slowest %.1f",
		r.ColdPicks, r.ColdPickP50Ms, r.ColdPickP99Ms, r.WarmPickP50Ms, r.WarmPickP99Ms, r.IdlePickP50Ms, r.IdlePickP99Ms, r.EchoP50Ms, r.EchoP99Ms, r.AtOnceP50Ms, r.AtOnceP99Ms, slowest[max(0, len(slowest)-10):])

	if c.FlipRate > 0 {
		peaks.peak(0, true)
		pc, ac, t0 = proc.CPU(p.pid()), proc.CPU(api), time.Now()
		if err := flipPods(ctx, env, c, isHot); err != nil {
			return r, err
		}
		el = time.Since(t0).Seconds()
		r.FlipPickerCPU, r.APIFlipCPU = (proc.CPU(p.pid())-pc)/el, (proc.CPU(api)-ac)/el
		r.APIFlipPeakRSS = peaks.peak(0, false)
		logf("pod updates at %.0f/s: kube-apiserver %.3f cores, peak %.0f MiB; poolpicker %.3f cores", c.FlipRate, r.APIFlipCPU, mib(r.APIFlipPeakRSS), r.FlipPickerCPU)
	}

	m, err = p.readMetrics(ctx)
	if err != nil {
		return r, err
	}
	r.HeapInuse, r.Goroutines = m.heapInuse, m.goroutines
	if c.profiles != "" {
		if err := p.saveProfile(ctx, "heap", fmt.Sprintf("%s.heap.%d%s", c.profiles, c.Pools, planSuffix(c.Plan))); err != nil {
			return r, err
		}
	}
	r.RSS, r.PeakRSS = proc.RSS(p.pid()), proc.StatusField(p.pid(), "VmHWM")
	r.APIPeakRSS = max(peaks.peak(0, false), r.APIPeakSyncRSS, r.APIFlipPeakRSS)
	logf("poolpicker RSS %.0f MiB (peak %.0f), heap %.0f MiB; kube-apiserver added %.0f MiB", mib(r.RSS), mib(r.PeakRSS), r.HeapInuse/(1<<20), mib(r.apiAdded()))
	return r, nil
}

// hotFigures are one window of hot-pool traffic's figures.
type hotFigures struct {
	Case string  `json:"case,omitempty"`
	CPU  float64 `json:"pickerCPU"`
	// ClientCPU is the harness's own CPU in the window (the gateway
	// sending the requests, on the same cores), ServersCPU the model
	// servers'.
	ClientCPU  float64 `json:"clientCPU,omitempty"`
	ServersCPU float64 `json:"serversCPU,omitempty"`
	Picks      int     `json:"picks"`
	PickRate   float64 `json:"picksPerSecond"`
	PickP50Ms  float64 `json:"pickP50Ms"`
	PickP99Ms  float64 `json:"pickP99Ms"`
	AgeP50Ms   float64 `json:"metricAgeP50Ms"`
	AgeP99Ms   float64 `json:"metricAgeP99Ms"`
	AgeMaxMs   float64 `json:"metricAgeMaxMs"`
	// BusyIntervalMs is the longest interval the scrape budget allowed a
	// busy pool's servers at the window's end; CPUPerScrapeUs the scrapes'
	// mean CPU cost as the budget measured it.
	BusyIntervalMs float64 `json:"busyIntervalMaxMs"`
	CPUPerScrapeUs float64 `json:"cpuPerScrapeMicros"`
	// Oldest are the picks that saw the oldest values.
	Oldest []string `json:"oldest,omitempty"`
	// BudgetLog are poolpicker's log lines about the scrape budget in the
	// window (and its warm-up, before +0), the time from the window's start
	// first.
	BudgetLog []string `json:"budgetLog,omitempty"`
	// ScrapeTimeouts are the scrapes that timed out in the window (the
	// hanging servers').
	ScrapeTimeouts float64 `json:"scrapeTimeouts,omitempty"`
	// NeighbourPicks are the picks the noisy neighbour's own gateway made
	// (counted in Picks), NeighbourCPU its CPU, with -noisy-own-gateway;
	// in an interleaved window, the noisy pool's picks in the slices the
	// figures are of.
	NeighbourPicks int     `json:"neighbourPicks,omitempty"`
	NeighbourCPU   float64 `json:"neighbourCPU,omitempty"`
	// QuietSlices are the pick and metric age figures of an interleaved
	// window's quiet slices (-noisy-interleave), the window's own figures
	// its loud slices'.
	QuietSlices *hotFigures `json:"quietSlices,omitempty"`
}

// measureNeighbours measures the other hot pools while one pool's
// servers hang until the scrape timeout, its traffic as the others', then
// while its servers answer and its traffic is Noisy times theirs; suffix
// tells the round's windows apart in the profiles' names.
func measureNeighbours(ctx context.Context, g *gateway, p *picker, servers *modelServers, c config, hot []int, suffix string) ([]hotFigures, error) {
	first := hot[0] * c.Pods
	m0, err := p.readMetrics(ctx)
	if err != nil {
		return nil, err
	}
	if err := servers.hang(first, first+c.Pods); err != nil {
		return nil, err
	}
	hang, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{}, true, "hanging"+suffix)
	if err != nil {
		return nil, fmt.Errorf("hanging neighbour: %w", err)
	}
	if err := servers.hang(0, 0); err != nil {
		return nil, err
	}
	m1, err := p.readMetrics(ctx)
	if err != nil {
		return nil, err
	}
	hang.Case, hang.ScrapeTimeouts = "hanging", m1.timeouts-m0.timeouts
	loud, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{times: c.Noisy}, true, "loud"+suffix)
	if err != nil {
		return nil, fmt.Errorf("%gx neighbour: %w", c.Noisy, err)
	}
	loud.Case = fmt.Sprintf("%gx traffic", c.Noisy)
	if !c.NoisyOwnGateway {
		return []hotFigures{hang, loud}, nil
	}
	own, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{times: c.Noisy, own: true}, true, "loud-own"+suffix)
	if err != nil {
		return nil, fmt.Errorf("%gx neighbour from its own gateway: %w", c.Noisy, err)
	}
	own.Case = fmt.Sprintf("%gx traffic, own gateway", c.Noisy)
	ns := []hotFigures{hang, loud, own}
	if c.NoisyInterleave <= 0 {
		return ns, nil
	}
	mixed, err := measureHot(ctx, g, p, servers, c, hot, neighbourLoad{times: c.Noisy, interleave: c.NoisyInterleave}, true, "interleaved"+suffix)
	if err != nil {
		return nil, fmt.Errorf("%gx neighbour, interleaved: %w", c.Noisy, err)
	}
	mixed.Case = fmt.Sprintf("%gx traffic in every other %s", c.Noisy, c.NoisyInterleave)
	return append(ns, mixed), nil
}

// neighbourLoad is the noisy pool's traffic in a window: times each other
// hot pool's (0: as theirs), sent by the timing client or, own, by a
// gateway process of its own; with interleave, only in every other slice
// of that length, the first slice quiet.
type neighbourLoad struct {
	times      float64
	own        bool
	interleave time.Duration
}

// loudAt tells whether t, in a window that started at t0, falls in one of
// the neighbour's loud slices of an interleaved window.
func loudAt(t0, t time.Time, slice time.Duration) bool {
	return (t.Sub(t0)/slice)%2 == 1
}

// sendHot sends the hot pools d of traffic as load says and returns the
// timing client's picks, with the neighbour's gateway's picks and CPU
// seconds when it has its own.
func sendHot(ctx context.Context, g *gateway, p *picker, c config, hot []int, load neighbourLoad, d time.Duration) ([]pick, int, float64, error) {
	if !load.own || len(hot) < 2 {
		picks, err := hotTraffic(ctx, g, c, hot, c.HotRate, load, d)
		return picks, 0, 0, err
	}
	perPool := c.HotRate / float64(len(hot))
	n, err := startNeighbour(ctx, p.grpcAddr, c, hot[0], load.times*perPool, d)
	if err != nil {
		return nil, 0, 0, err
	}
	picks, err := hotTraffic(ctx, g, c, hot[1:], perPool*float64(len(hot)-1), neighbourLoad{}, d)
	// Awaited on failure too: the process does not outlive the window.
	theirs, cpu, werr := n.wait()
	return picks, theirs, cpu, errors.Join(err, werr)
}

// logNeighbours logs each noisy window against its quiet one.
func logNeighbours(logf func(string, ...any), quiet hotFigures, ns []hotFigures) {
	for _, n := range ns {
		if n.QuietSlices != nil {
			quiet = *n.QuietSlices
			logf("noisy neighbour, %s: its quiet slices' metric age p99 %.0f ms, pick p99 %.1f ms", n.Case, quiet.AgeP99Ms, quiet.PickP99Ms)
		}
		logf("noisy neighbour, %s: the other pools' metric age p99 %.0f ms (%.2fx quiet), pick p50 %.2f ms p99 %.1f ms (%.2fx quiet); poolpicker %.3f cores (the client %.3f, the neighbour's gateway %.3f) at %.0f picks/s; %.0f scrapes timed out; oldest %q",
			n.Case, n.AgeP99Ms, n.AgeP99Ms/quiet.AgeP99Ms, n.PickP50Ms, n.PickP99Ms, n.PickP99Ms/quiet.PickP99Ms, n.CPU, n.ClientCPU, n.NeighbourCPU, n.PickRate, n.ScrapeTimeouts, n.Oldest)
	}
}

// noisyRound is a round of noisy-neighbour windows past the first: its
// own quiet window and the windows with the neighbour.
type noisyRound struct {
	Quiet      hotFigures   `json:"quiet"`
	Neighbours []hotFigures `json:"neighbours"`
}

// measureHot sends the hot pools hotWindow of traffic (hot[0]'s as load
// says; twice as long when interleaved) and returns the figures, hot[0]'s
// picks left out when others is set. With -profiles, poolpicker's CPU
// profile of the window is saved as name's.
func measureHot(ctx context.Context, g *gateway, p *picker, servers *modelServers, c config, hot []int, load neighbourLoad, others bool, name string) (hotFigures, error) {
	var f hotFigures
	warm := time.Now()
	// Each window has its warm-up under its own conditions: between
	// windows the pools go without requests for longer than the demand
	// window while the harness reads the figures, and their first picks
	// would be routed on idle values.
	if _, _, _, err := sendHot(ctx, g, p, c, hot, load, c.hotWarmup); err != nil {
		return f, fmt.Errorf("hot traffic warm-up: %w", err)
	}
	// save fetches poolpicker's pprof endpoint what into a file named by
	// prefix, kind and this window, while the traffic runs; with no
	// prefix it saves nothing.
	save := func(prefix, kind, what string) <-chan error {
		done := make(chan error, 1)
		if prefix == "" {
			done <- nil
			return done
		}
		go func() {
			done <- p.saveProfile(ctx, what, fmt.Sprintf("%s.%s-%s.%d%s", prefix, kind, name, c.Pools, planSuffix(c.Plan)))
		}()
		return done
	}
	prof := save(c.profiles, "cpu", fmt.Sprintf("profile?seconds=%d", max(1, int(c.hotWindow/time.Second)))) // the first half of an interleaved window
	trace := save(c.traces, "trace", "trace?seconds=5")
	pc, hc, sc, t0 := proc.CPU(p.pid()), proc.CPU(os.Getpid()), servers.cpu(), time.Now()
	window := c.hotWindow
	if load.interleave > 0 {
		window *= 2 // each phase as long as a window of its own
	}
	picks, theirs, theirCPU, err := sendHot(ctx, g, p, c, hot, load, window)
	el := time.Since(t0).Seconds()
	f.NeighbourPicks, f.NeighbourCPU = theirs, theirCPU/el
	f.CPU, f.ClientCPU, f.ServersCPU = (proc.CPU(p.pid())-pc)/el, (proc.CPU(os.Getpid())-hc)/el, (servers.cpu()-sc)/el
	// The saves end with their windows; they are awaited on failure too,
	// so that none outlives the window.
	saved := errors.Join(<-prof, <-trace)
	if err != nil {
		return f, fmt.Errorf("hot traffic: %w", err)
	}
	if saved != nil {
		return f, saved
	}
	// The budget's plan at the window's end (set every second).
	m, err := p.readMetrics(ctx)
	if err != nil {
		return f, err
	}
	f.BusyIntervalMs, f.CPUPerScrapeUs = m.busyInterval*1e3, m.perScrape*1e6
	f.Picks = len(picks) + theirs
	f.PickRate = float64(f.Picks) / el
	f.BudgetLog = p.log.budgetSince(warm, t0)
	if load.interleave <= 0 {
		if others {
			picks = slices.DeleteFunc(picks, func(pk pick) bool { return pk.pool == hot[0] })
		}
		return f, f.fromPicks(picks, servers, t0)
	}
	// The figures are the other pools' picks in the loud slices,
	// QuietSlices theirs in the quiet ones.
	var quiet, loud []pick
	f.QuietSlices = &hotFigures{}
	for _, pk := range picks {
		into, fig := &quiet, f.QuietSlices
		if loudAt(t0, pk.sent, load.interleave) {
			into, fig = &loud, &f
		}
		if pk.pool == hot[0] {
			fig.NeighbourPicks++
		} else {
			*into = append(*into, pk)
		}
	}
	f.QuietSlices.Picks = len(quiet) + f.QuietSlices.NeighbourPicks
	return f, errors.Join(f.fromPicks(loud, servers, t0), f.QuietSlices.fromPicks(quiet, servers, t0))
}

// fromPicks sets the pick latency and metric age figures of picks, sent
// from t0 on.
func (f *hotFigures) fromPicks(picks []pick, servers *modelServers, t0 time.Time) error {
	qs := make([]ageQuery, len(picks))
	lat := make([]float64, len(picks))
	for k, pk := range picks {
		qs[k] = ageQuery{Addr: pk.addr, At: pk.sent.UnixNano()}
		lat[k] = ms(pk.latency)
	}
	served, err := servers.lastServed(qs)
	if err != nil {
		return err
	}
	// The age of what a pick saw: from the last page its server sent
	// before the request was sent to the answer (a scrape in flight when
	// the request arrived counts as seen, so this errs at most by one
	// page's parse time).
	ages := make([]float64, 0, len(picks))
	for k, pk := range picks {
		if served[k] == 0 {
			return fmt.Errorf("pod %d was picked before its server was ever scraped", pk.addr)
		}
		ages = append(ages, ms(pk.sent.Add(pk.latency).Sub(time.Unix(0, served[k]))))
	}
	f.PickP50Ms, f.PickP99Ms = percentile(lat, 50), percentile(lat, 99)
	f.AgeP50Ms, f.AgeP99Ms, f.AgeMaxMs = percentile(ages, 50), percentile(ages, 99), percentile(ages, 100)
	// The oldest values seen, with their pod and when in the window, for
	// telling one stale server from a stall of every scrape.
	order := make([]int, len(ages))
	for k := range order {
		order[k] = k
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(ages[b], ages[a]) })
	for _, k := range order[:min(len(order), 8)] {
		f.Oldest = append(f.Oldest, fmt.Sprintf("pod %d at +%.1fs: %.0f ms", picks[k].addr, picks[k].sent.Sub(t0).Seconds(), ages[k]))
	}
	return nil
}

// flipPods makes pods of pools without traffic (the cold ones included) not ready and ready again, FlipRate
// status writes per second for flipWindow, and leaves them all ready.
func flipPods(ctx context.Context, env *testenv.Env, c config, skip map[int]bool) error {
	var idle []int
	for i := range c.Pools {
		if !skip[i] {
			idle = append(idle, i)
		}
	}
	if len(idle) == 0 {
		return nil
	}
	set := func(k int, ready bool) error {
		pool := idle[k%len(idle)]
		status := corev1.ConditionTrue
		if !ready {
			status = corev1.ConditionFalse
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace(pool, c.Namespaces), Name: podName(pool, (k/len(idle))%c.Pods)}}
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"PodScheduled","status":"True"},{"type":"Ready","status":%q}]}}`, status)
		return env.Client.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(patch)))
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / c.FlipRate))
	defer tick.Stop()
	end := time.After(c.flipWindow)
	k := 0
	for ; ; k++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			if k%2 == 1 {
				return set(k/2, true)
			}
			return nil
		case <-tick.C:
		}
		if err := set(k/2, k%2 == 1); err != nil {
			return fmt.Errorf("flipping a pod: %w", err)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func mib(b int64) float64        { return float64(b) / (1 << 20) }

// percentile is the q-th percentile (nearest rank) of vs, 0 when empty.
func percentile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(q/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func planSuffix(p string) string {
	if p == "" {
		return ""
	}
	return "." + p
}

func planName(p string) string {
	if p == "" {
		return "default plan"
	}
	return p + " plan"
}
