// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command scale holds poolpicker to its scale goals: N InferencePools × M
// pods on a real API server, every pod on its own loopback address
// (127.100.x.y) served by a few model-server processes with real-size vLLM
// pages, the poolpicker binary with its default flags, 1 % of the pools
// under ext_proc traffic and the rest idle. For each pool count and pod
// watch plan it reports poolpicker's RSS, heap and CPU (idle and under the
// hot pools' traffic), sync time and API requests at start, the first pick
// of cold pools and the metric age seen by picks of hot pools, and what
// kube-apiserver spends beside it.
//
// The cluster is populated once per shape and kept as an etcd data
// directory (-snapshots); every run starts a fresh etcd and kube-apiserver on
// a copy of it, so the API server's memory added by poolpicker's watches is
// its peak with the watches less its steady RSS with the objects alone, on a
// server no earlier run has touched.
//
//	go -C bench run ./scale -pools 100,300,1000,3000 -out scale/results.json
//	go -C bench run ./scale -pools 10000 -picker-args=--kube-api-qps=300 -out scale/results.json
//	go -C bench run ./scale -from-json scale/results.json -svg ../site-src/images/scale.svg -markdown
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// config is one run's shape and timing.
type config struct {
	Pools      int     `json:"pools"`
	Pods       int     `json:"pods"`
	Namespaces int     `json:"namespaces"`
	Plan       string  `json:"plan"`
	PickerArgs string  `json:"pickerArgs"`
	HotShare   float64 `json:"hotShare"`
	HotRate    float64 `json:"hotRate"`
	FlipRate   float64 `json:"flipRate"`
	Noisy      float64 `json:"noisy,omitempty"`
	// NoisyRounds is how many times the quiet and noisy windows are
	// measured; the ratios reported are the median over the rounds.
	NoisyRounds int `json:"noisyRounds,omitempty"`
	// NoisyOwnGateway adds a window whose noisy traffic comes from a
	// gateway process of its own instead of the timing client.
	NoisyOwnGateway bool `json:"noisyOwnGateway,omitempty"`
	// NoisyInterleave adds a window that alternates slices of this length
	// without and with the noisy traffic, each compared with the other.
	NoisyInterleave time.Duration `json:"noisyInterleave,omitempty"`
	Servers         int           `json:"servers"`
	Port            int           `json:"port"`
	// BackgroundNice is the nice value of the processes that stand in for
	// other machines: the model servers from their start, etcd and
	// kube-apiserver from poolpicker's sync on (0: all at normal priority).
	BackgroundNice int `json:"backgroundNice"`

	settle, idleWindow, hotWindow, flipWindow time.Duration
	steadyWait, hotWarmup                     time.Duration
	coldPicks                                 int
	snapshots                                 string
	logPicker, populateOnly                   bool
	profiles, traces                          string
	pickerBin                                 string
}

func main() {
	var (
		c        config
		pools    string
		plans    string
		out      string
		fromJSON string
		svg      string
		md       bool
	)
	if served, err := serveRole(); served {
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		return
	}
	flag.StringVar(&pools, "pools", "1000", "Comma-separated pool counts, one run each.")
	flag.IntVar(&c.Pods, "pods", 5, "Ready pods per pool, each on its own loopback address.")
	flag.IntVar(&c.Namespaces, "namespaces", 10, "Namespaces the pools are spread over.")
	flag.StringVar(&plans, "plans", "", "Comma-separated values of poolpicker's --pod-watch-plan, one run each per pool count; empty: the flag is not passed (the binary's default).")
	flag.StringVar(&c.PickerArgs, "picker-args", "", "Extra poolpicker flags, space-separated (for example --kube-api-qps=300).")
	flag.Float64Var(&c.HotShare, "hot", 0.01, "Share of pools that receive traffic (at least one).")
	flag.Float64Var(&c.HotRate, "hot-rate", 200, "Requests per second over all hot pools.")
	flag.Float64Var(&c.Noisy, "noisy", 0, "Noisy neighbour: after the hot window, two more, one with a hot pool's servers hanging until the scrape timeout, one with its traffic at this many times each other hot pool's (-noisy-own-gateway and -noisy-interleave add two more); every hot figure is the other pools' (0: none).")
	flag.IntVar(&c.NoisyRounds, "noisy-rounds", 1, "With -noisy: rounds of a quiet window and its noisy ones; each ratio reported is the median over the rounds of each noisy window against its round's quiet one.")
	flag.BoolVar(&c.NoisyOwnGateway, "noisy-own-gateway", false, "With -noisy: a third window, the same traffic with the noisy pool's requests sent by a gateway process of its own (its own connection, at -background-nice, as another tenant's gateway on another machine) instead of the timing client.")
	flag.DurationVar(&c.NoisyInterleave, "noisy-interleave", 0, "With -noisy-own-gateway: a fourth window, twice as long, alternating slices of this length without and with the noisy traffic (from the timing client); its ratios compare its loud slices with its quiet ones, so that drift over the round weighs on both alike (0: none).")
	flag.Float64Var(&c.FlipRate, "flip-rate", 20, "Pod readiness flips per second during the pod-update phase (0: no such phase).")
	flag.IntVar(&c.Servers, "servers", 4, "Model-server processes serving every pod address.")
	flag.IntVar(&c.BackgroundNice, "background-nice", 19, "Nice value of the model servers and, after poolpicker's sync, of etcd and kube-apiserver, which in a cluster run on other machines than poolpicker's (0: normal priority, as poolpicker and the timing client).")
	flag.IntVar(&c.Port, "port", 28123, "Port of every model server (the pools' target port); it must be free on every loopback address.")
	flag.DurationVar(&c.steadyWait, "steady-wait", 5*time.Second, "Time the API server is left alone after its caches are warm, before its steady RSS is taken (the most over the next 5 s).")
	flag.DurationVar(&c.hotWarmup, "hot-warmup", 5*time.Second, "Hot-pool traffic sent before each measured window, under its conditions.")
	flag.DurationVar(&c.settle, "settle", 60*time.Second, "Time after sync before the idle window, so that idle servers decay to the idle interval.")
	flag.DurationVar(&c.idleWindow, "idle-window", 30*time.Second, "Window over which idle CPU is measured (one idle refresh interval covers every server once).")
	flag.DurationVar(&c.hotWindow, "hot-window", 20*time.Second, "Window of hot-pool traffic measured (after 5 s of warm-up traffic).")
	flag.DurationVar(&c.flipWindow, "flip-window", 20*time.Second, "Window of pod readiness flips measured.")
	flag.IntVar(&c.coldPicks, "cold-picks", 200, "Cold pools sent their first request, one at a time.")
	flag.StringVar(&c.snapshots, "snapshots", filepath.Join(os.TempDir(), "poolpicker-scale"), "Directory of populated etcd data directories, one per shape, reused across runs.")
	flag.StringVar(&c.pickerBin, "picker-bin", "", "A poolpicker binary built beforehand (an A/B of two builds runs each in its own invocation); empty: build cmd/poolpicker of this tree.")
	flag.StringVar(&c.profiles, "profiles", "", "Save poolpicker's heap profile at the end of each run, and CPU profiles of the sync, each hot window and the cold picks, under this path prefix.")
	flag.StringVar(&c.traces, "traces", "", "Save poolpicker's execution trace of the first 5 s of each hot window and of the cold picks under this path prefix (go tool trace).")
	flag.BoolVar(&c.logPicker, "log-picker", false, "Pass poolpicker's log to stderr.")
	flag.BoolVar(&c.populateOnly, "populate-only", false, "Only populate (and keep) the snapshots of the pool counts, measure nothing.")
	flag.StringVar(&out, "out", "", "JSON file the results are merged into (by pool count and plan), for -from-json.")
	flag.StringVar(&fromJSON, "from-json", "", "Render the table (and -svg) from this results file instead of running.")
	flag.BoolVar(&md, "markdown", false, "With -from-json: print the performance page's table instead of the report.")
	flag.StringVar(&svg, "svg", "", "Write the plot of cost against pool count to this file.")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard()) // envtest's start-up chatter
	if err := mainErr(c, pools, plans, out, fromJSON, svg, md); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// serveRole runs this process as one of the copies of itself the harness
// starts, a model server or a noisy neighbour's gateway, when the
// environment names one, and tells whether it did.
func serveRole() (bool, error) {
	if port := os.Getenv(roleEnv); port != "" {
		if err := serveModelServers(port); err != nil {
			return true, fmt.Errorf("model server: %w", err)
		}
		return true, nil
	}
	if os.Getenv(echoEnv) != "" {
		if err := serveEcho(); err != nil {
			return true, fmt.Errorf("loopback echo: %w", err)
		}
		return true, nil
	}
	if job := os.Getenv(neighbourEnv); job != "" {
		if err := serveNeighbour(job); err != nil {
			return true, fmt.Errorf("neighbour's gateway: %w", err)
		}
		return true, nil
	}
	return false, nil
}

// startRole starts a copy of the harness's binary in the role env
// ("NAME=value") selects (serveRole), its standard error the harness's,
// and returns it with a reader of its standard output.
func startRole(ctx context.Context, env string) (*exec.Cmd, *bufio.Reader, error) {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, bufio.NewReader(out), nil
}

func mainErr(c config, pools, plans, out, fromJSON, svg string, md bool) error {
	if fromJSON != "" {
		rs, err := readResults(fromJSON)
		if err != nil {
			return err
		}
		if md {
			markdown(os.Stdout, rs)
		} else {
			printReport(os.Stdout, rs)
		}
		if svg != "" {
			return os.WriteFile(svg, []byte(plot(rs)), 0o644)
		}
		return nil
	}
	var counts []int
	for _, s := range strings.Split(pools, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-pools %q: want positive integers", pools)
		}
		counts = append(counts, n)
	}
	if c.Pods < 1 || c.Namespaces < 1 || c.Servers < 1 || c.HotShare <= 0 || c.HotShare > 1 {
		return errors.New("-pods, -namespaces and -servers must be >= 1 and -hot in (0, 1]")
	}
	if c.NoisyInterleave != 0 && (c.NoisyInterleave < 0 || !c.NoisyOwnGateway) {
		return errors.New("-noisy-interleave must be positive and needs -noisy-own-gateway (its window is the fourth noisy one)")
	}
	if c.Pools*c.Pods > maxAddresses {
		return fmt.Errorf("at most %d pod addresses", maxAddresses)
	}
	planList := []string{""}
	if plans != "" {
		planList = strings.Split(plans, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := raiseFileLimit(); err != nil {
		return err
	}
	bin := c.pickerBin
	if bin == "" {
		b, cleanup, err := buildPicker(ctx)
		if err != nil {
			return err
		}
		defer cleanup()
		bin = b
	}
	if c.populateOnly {
		for _, n := range counts {
			pc := c
			pc.Pools = n
			dir, took, err := ensureSnapshot(ctx, pc, bin)
			if err != nil {
				return err
			}
			fmt.Printf("%s: populated in %s\n", dir, took.Round(time.Second))
		}
		return nil
	}
	var rs []result
	var failed error
	for _, n := range counts {
		for _, plan := range planList {
			rc := c
			rc.Pools, rc.Plan = n, strings.TrimSpace(plan)
			r, err := runOne(ctx, rc, bin)
			if err != nil {
				// The next runs may still complete: say what failed and go on.
				failed = errors.Join(failed, fmt.Errorf("%d pools, %s: %w", n, planName(rc.Plan), err))
				fmt.Fprintln(os.Stderr, "scale:", failed)
				if ctx.Err() != nil {
					return failed
				}
				continue
			}
			rs = append(rs, r)
			if out != "" {
				if err := mergeResults(out, r); err != nil {
					return err
				}
			}
			printReport(os.Stdout, rs)
		}
	}
	if svg != "" && out != "" {
		all, err := readResults(out)
		if err != nil {
			return err
		}
		if err := os.WriteFile(svg, []byte(plot(all)), 0o644); err != nil {
			return err
		}
	}
	return failed
}

// raiseFileLimit lets the model servers and poolpicker (which inherit it)
// hold a connection per pod address.
func raiseFileLimit() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	want := uint64(400_000)
	if l.Max >= want {
		l.Cur = l.Max
	} else {
		l.Cur, l.Max = want, want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		// Not root: keep the hard limit, which the harness's sizes may exceed.
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
		l.Cur = l.Max
		return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return nil
}

func readResults(path string) ([]result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rs []result
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rs, nil
}

// mergeResults replaces the run of the same pool count and plan in path's
// results, or adds it, keeping them ordered by plan then pool count.
func mergeResults(path string, r result) error {
	rs, err := readResults(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kept := rs[:0]
	for _, o := range rs {
		if o.Pools != r.Pools || o.Plan != r.Plan {
			kept = append(kept, o)
		}
	}
	kept = append(kept, r)
	sortResults(kept)
	b, err := json.MarshalIndent(kept, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
