// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command routing measures routing quality: on a fleet of simulated model
// servers (modelsim, real HTTP servers on their own loopback IPs, with a
// block-level prefix cache and LRU eviction), traffic whose prompts share
// one of G long prefixes goes through poolpicker's real ext_proc server
// and then to the endpoint it picks, as a gateway sends it. Every point of
// the sweep (G × offered load, as a share of the fleet's capacity at full
// hit rate) runs each router on its own fleet at the same time, on the same
// seeded requests: poolpicker's default profile, round-robin, least-queue
// and the reference EPP itself (its binary, run against a real API server:
// reference.go); "upstream-weights", the reference's default profile
// written over poolpicker's scheduler, is there to name for a machine
// without that binary.
// Poolpicker runs with 1, 2 and 3 replicas side by side (-replicas), each
// replica an ext_proc server with its own scraper, scheduler and prefix
// index, the streams spread over them as a gateway spreads them (-spread).
// With -sim llm-d the servers are the llm-d project's vLLM simulator
// instead (-llmd-sim-bin; see llmdsim.go), a second simulator written
// independently of modelsim.
// Routers llm-d and llm-d-precise are llm-d's own endpoint picker in its
// default and its precise prefix-cache configuration (-llmd-epp;
// llmdepp.go, and NOTES.md for how to build it and what it measured).
//
//	go -C bench run ./routing -time-scale 2 -requests 300 -svg ../site-src/images/routing-sweep.svg -markdown /tmp/routing.md -json /tmp/routing.json
//
// The servers run -time-scale times faster than the costs they simulate;
// every figure is reported in simulated time. It prints TTFT p50/p90/p99,
// end-to-end p90, prefix-cache hit rate (cached over prompt tokens, from
// the responses' usage) and throughput per point and router, and what
// sheddable requests (objective of negative priority) got: a 429 when the
// pool is saturated, while critical ones keep being served.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

func main() { os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr)) }

func mainCode(args []string, stdout, stderr io.Writer) int {
	// An interrupted sweep stops its fleets, the reference EPPs and the
	// control plane on the way out, rather than leaving them running.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := defaultSweep()
	fs := flag.NewFlagSet("routing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	groups := fs.String("groups", "6,12,24,48", "numbers of shared prefixes G, comma-separated")
	loads := fs.String("loads", "50,80,100,120", "offered loads in percent of the fleet's capacity at full hit rate, comma-separated")
	routers := fs.String("routers", "poolpicker,round-robin,least-queue,reference-epp", "routers to compare, comma-separated (known: "+strings.Join(routerNames(), ", ")+"; reference-epp is left out, saying why, when its binary or the control plane is missing)")
	fs.StringVar(&referenceBinary, "reference-epp", defaultReferenceBinary(), "the reference EPP's binary, for router reference-epp (`make reference-epp` builds it there)")
	fs.StringVar(&llmdBinary, "llmd-epp", "", "llm-d's EPP binary (cmd/epp of github.com/llm-d/llm-d-router, built from its public source; NOTES.md), for routers llm-d and llm-d-precise")
	rates := fs.String("rates", "", "offered loads in requests per simulated second, comma-separated, in place of -loads")
	baseline := fs.String("baseline", llmdRouterName, "the router each point's other routers are compared with (TTFT ratios, hit-rate difference), when it ran")
	serverSlots := fs.String("server-slots", "", "each server's sequences at once, comma-separated (unequal servers; as many as -servers), in place of -slots")
	serverKV := fs.String("server-kv-blocks", "", "each server's KV-cache blocks, comma-separated (unequal servers; as many as -servers), in place of -kv-blocks")
	fs.BoolVar(&c.ordinaryWords, "ordinary-words", c.ordinaryWords, "prompts of ordinary English words, a word a token (as the llm-d simulator's tokenizer counts; about 6 bytes a token), in place of short words sized at 4 bytes a token")
	fs.IntVar(&c.loraAdapters, "lora-adapters", c.loraAdapters, "LoRA adapters the requests name (a prefix group's requests name one; 0: the base model)")
	fs.IntVar(&c.maxLoRAs, "max-loras", 2, "LoRA adapters a server holds at once (--max-loras), with -lora-adapters")
	preciseReplicas := fs.String("precise-replicas", "", "numbers of replicas "+preciseRouterName+" runs with, in place of -replicas (its replicas share no peer sync: each reads the servers' KV-cache events itself)")
	replicas := fs.String("replicas", "1,2,3", "numbers of poolpicker replicas poolpicker and each -router-config router run with, side by side, comma-separated: each replica has its own scraper, scheduler and prefix index (the baselines run one)")
	fs.Func("spread", "how streams are spread over the replicas: round-robin (as a gateway's round robin over the picker Service) or random", func(v string) error {
		switch m := spreadMode(v); m {
		case spreadRoundRobin, spreadRandom:
			c.spread = m
			return nil
		}
		return fmt.Errorf("want round-robin or random, got %q", v)
	})
	fs.StringVar(&c.sim, "sim", c.sim, "model-server simulator: modelsim (poolpicker's, in this process) or llm-d (the llm-d project's vLLM simulator, a process per server, from -llmd-sim-bin)")
	fs.StringVar(&c.llmdBin, "llmd-sim-bin", "", "the llm-d-inference-sim binary, built from github.com/llm-d/llm-d-inference-sim (for -sim llm-d)")
	fs.IntVar(&c.requests, "requests", c.requests, "requests per point and router")
	fs.IntVar(&c.runs, "runs", c.runs, "runs of each point, every router on the same requests in each (the odd runs take the routers in reverse order); with more than one, the medians are printed after the runs and written to -json and -markdown")
	fs.IntVar(&c.conversations, "conversations", c.conversations, "multi-turn chat: this many conversations over the -groups system prompts, each turn's prompt the conversation so far and a new question (0: single prompts)")
	fs.IntVar(&c.kvEventBatch, "kv-event-batch", c.kvEventBatch, "KV-cache events the llm-d simulator sends together (its --event-batch-size; it sends a smaller batch after a second): 1 publishes each at once, as vLLM publishes each engine step's")
	fs.StringVar(&c.traceDir, "trace", "", "write a CSV line per request of each router's run (its server, TTFT, end-to-end time, prompt and cached tokens) to a new file in this directory")
	fs.Float64Var(&c.warmup, "warmup", c.warmup, "leading share of each run's requests left out of the figures")
	fs.Float64Var(&c.sheddable, "sheddable", c.sheddable, "share of requests whose objective is sheddable (priority -1)")
	fs.Float64Var(&c.timeScale, "time-scale", c.timeScale, "servers run this many times faster than the simulated costs")
	fs.Uint64Var(&c.seed, "seed", c.seed, "seed of the workload and the schedulers' tie-breaks")
	fs.IntVar(&c.servers, "servers", c.servers, "model servers per fleet")
	fs.IntVar(&c.slots, "slots", c.slots, "sequences a server runs at once (--max-num-seqs)")
	fs.IntVar(&c.kvBlocks, "kv-blocks", c.kvBlocks, "KV-cache blocks per server")
	fs.IntVar(&c.blockTokens, "block-size", c.blockTokens, "tokens per KV-cache block")
	fs.IntVar(&c.promptBytesPerToken, "prompt-bytes-per-token", c.promptBytesPerToken, "prompt bytes a modelsim server counts as one token (0: 4, what the prompts are sized by; another value stands for a tokenizer the picker cannot know)")
	fs.IntVar(&c.prefixTokens, "prefix-tokens", c.prefixTokens, "tokens of each shared prefix")
	fs.IntVar(&c.suffixTokens, "suffix-tokens", c.suffixTokens, "tokens of each request's unique suffix")
	fs.IntVar(&c.outputTokens, "output-tokens", c.outputTokens, "tokens generated per request")
	fs.DurationVar(&c.prefillOverhead, "prefill-overhead", c.prefillOverhead, "fixed prefill time per request (simulated)")
	fs.DurationVar(&c.prefillPerToken, "prefill-per-token", c.prefillPerToken, "prefill time per uncached prompt token (simulated)")
	fs.DurationVar(&c.decodePerToken, "decode-per-token", c.decodePerToken, "time per output token with one sequence running (simulated)")
	fs.Float64Var(&c.loadSlowdown, "load-slowdown", c.loadSlowdown, "fractional slowdown of every step per other running sequence")
	fs.DurationVar(&c.scrapeInterval, "scrape-interval", c.scrapeInterval, "metrics scrape interval (simulated)")
	var extra []router
	configRouter := func(peerSync bool) func(string) error {
		return func(v string) error {
			r, err := routerFromConfig(v, peerSync)
			if err != nil {
				return err
			}
			extra = append(extra, r)
			return nil
		}
	}
	fs.Func("router-config", "add a router NAME=FILE whose EndpointPickerConfig is read from FILE (repeatable)", configRouter(false))
	fs.Func("peer-sync-router-config", "add a router NAME=FILE as -router-config does, its replicas linked by peer sync as poolpicker-peer-sync's are (repeatable)", configRouter(true))
	fs.Func("precise-config", "add the router poolpicker-precise whose EndpointPickerConfig (precise prefix-cache routing from the servers' KV-cache events) is read from FILE", func(v string) error {
		return configRouter(false)(preciseRouterName + "=" + v)
	})
	preciseSync := fs.Bool("precise-peer-sync", false, "also run "+preciseRouterName+"'s config as "+precisePeerSyncRouterName+
		": its replicas linked by peer sync, sharing their requests in flight (the precise scorer shares no blocks of an endpoint whose KV events it follows), with the numbers of replicas above 1 of -precise-replicas (or -replicas)")
	fs.BoolVar(&c.parallel, "parallel", c.parallel, "run a point's routers at once, so the machine's load falls on them alike (false: one after the other)")
	fairness := bindFlowFlags(fs)
	verbose := fs.Bool("v", false, "print each server's counters after each run")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	svg := fs.String("svg", "", "write the plot (SVG) to this file")
	markdown := fs.String("markdown", "", "write the table (Markdown) to this file")
	jsonOut := fs.String("json", "", "write the results (JSON) to this file")
	fromJSON := fs.String("from-json", "", "run nothing: read results written by -json (several files, comma-separated, e.g. a sweep run in pieces) and write the table and plot of them all")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if c.groups, err = parseInts(*groups); err != nil {
		fmt.Fprintf(stderr, "-groups: %v\n", err)
		return 2
	}
	pct, err := parseInts(*loads)
	if err != nil {
		fmt.Fprintf(stderr, "-loads: %v\n", err)
		return 2
	}
	if c.replicas, err = parseInts(*replicas); err != nil {
		fmt.Fprintf(stderr, "-replicas: %v\n", err)
		return 2
	}
	c.loads = nil
	for _, p := range pct {
		c.loads = append(c.loads, float64(p)/100)
	}
	for _, f := range []struct {
		name, v string
		to      *[]int
	}{{"-server-slots", *serverSlots, &c.serverSlots}, {"-server-kv-blocks", *serverKV, &c.serverKVBlocks}} {
		if f.v == "" {
			continue
		}
		if *f.to, err = parseInts(f.v); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", f.name, err)
			return 2
		}
	}
	if *rates != "" {
		rs, err := parseFloats(*rates)
		if err != nil {
			fmt.Fprintf(stderr, "-rates: %v\n", err)
			return 2
		}
		c.loads = nil
		for _, r := range rs {
			c.loads = append(c.loads, r/c.capacity())
		}
	}
	if c.routers, err = parseRouters(*routers); err != nil {
		fmt.Fprintf(stderr, "-routers: %v\n", err)
		return 2
	}
	if *preciseReplicas != "" {
		n, err := parseInts(*preciseReplicas)
		if err == nil && slices.Max(n) > 16 {
			err = fmt.Errorf("%d: at most 16", slices.Max(n))
		}
		if err != nil {
			fmt.Fprintf(stderr, "-precise-replicas: %v\n", err)
			return 2
		}
		for i := range extra {
			if extra[i].name == preciseRouterName {
				extra[i].replicas = n
			}
		}
	}
	if *preciseSync {
		i := slices.IndexFunc(extra, func(r router) bool { return r.name == preciseRouterName })
		if i < 0 {
			fmt.Fprintln(stderr, "-precise-peer-sync: no -precise-config")
			return 2
		}
		extra = append(extra, precisePeerSync(extra[i], c.replicas))
	}
	c.routers = append(dropReference(c.routers, stderr), extra...)
	defer stopControlPlane()
	if err := c.check(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *fromJSON != "" {
		all, err := readResults(strings.Split(*fromJSON, ","))
		if err != nil {
			fmt.Fprintf(stderr, "-from-json: %v\n", err)
			return 1
		}
		printResults(stdout, all, true)
		return writeOutputs(stderr, all, c, *markdown, *svg, "")
	}
	fmt.Fprintf(stdout, "fleet: %d servers × %s slots, KV %s blocks × %d tokens; prompts %d+%d tokens, %d out; service %v at full hit, capacity %.1f req/s (simulated; time scale %g)\n",
		c.servers, perServer(c.servers, c.slotsOf), perServer(c.servers, c.kvBlocksOf), c.blockTokens, c.prefixTokens, c.suffixTokens, c.outputTokens, c.serviceTime().Round(time.Millisecond), c.capacity(), c.timeScale)
	if *fairness > 0 {
		return runFairness(ctx, &c, *fairness, stdout, stderr)
	}
	var all []result
	for _, g := range c.groups {
		for _, l := range c.loads {
			var runs [][]result
			for run := range c.runs {
				if c.runs > 1 {
					fmt.Fprintf(stdout, "G=%d load=%.0f%%: run %d of %d (routers in %s order), load average %s\n", g, l*100, run+1, c.runs, map[bool]string{false: "given", true: "reverse"}[run%2 == 1], loadAverage())
				}
				rs, err := runPoint(ctx, &c, g, l, run%2 == 1)
				if err != nil {
					fmt.Fprintln(stderr, err)
					return 1
				}
				printResults(stdout, rs, len(all) == 0 && run == 0)
				printRatios(stdout, rs, *baseline)
				printBestRatios(stdout, rs)
				if *verbose {
					for _, r := range rs {
						fmt.Fprintf(stdout, "  %s: %s\n", r.router, strings.Join(r.servers, "; "))
					}
				}
				runs = append(runs, rs)
			}
			rs := runs[0]
			if len(runs) > 1 {
				rs = medians(runs)
				fmt.Fprintf(stdout, "G=%d load=%.0f%%: medians of %d runs\n", g, l*100, len(runs))
				printResults(stdout, rs, true)
				printRatios(stdout, rs, *baseline)
				printBestRatios(stdout, rs)
			}
			all = append(all, rs...)
		}
	}
	return writeOutputs(stderr, all, c, *markdown, *svg, *jsonOut)
}

// writeOutputs writes the table, plot and JSON of the results to the files
// named (empty: not written).
func writeOutputs(stderr io.Writer, all []result, c sweepConfig, markdown, svg, jsonOut string) int {
	var groups []int
	var routers []router
	for _, r := range all {
		if !slices.Contains(groups, r.groups) {
			groups = append(groups, r.groups)
		}
		if !slices.ContainsFunc(routers, func(x router) bool { return x.name == r.series() }) {
			routers = append(routers, router{name: r.series()})
		}
	}
	outputs := []struct {
		file string
		text func() string
	}{
		{markdown, func() string { return markdownTable(all) }},
		{svg, func() string { return plot(all, groups, routers) }},
		{jsonOut, func() string { b, _ := json.MarshalIndent(exported(all), "", "  "); return string(b) }},
	}
	for _, o := range outputs {
		if o.file == "" {
			continue
		}
		if err := os.WriteFile(o.file, []byte(o.text()), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	return 0
}

// readResults reads the results of -json files, ordered by G and load
// (routers in the order read).
func readResults(files []string) ([]result, error) {
	var all []result
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var rs []exportedResult
		if err := json.Unmarshal(b, &rs); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, e := range rs {
			all = append(all, e.result())
		}
	}
	slices.SortStableFunc(all, func(a, b result) int {
		if a.groups != b.groups {
			return a.groups - b.groups
		}
		return cmp.Compare(a.load, b.load)
	})
	return all, nil
}

func (c *sweepConfig) check() error {
	switch {
	case c.requests < 20:
		return fmt.Errorf("-requests %d: at least 20", c.requests)
	case c.runs < 1 || c.runs > 99:
		return fmt.Errorf("-runs %d: between 1 and 99", c.runs)
	case c.conversations < 0 || c.conversations > 10000:
		return fmt.Errorf("-conversations %d: between 0 and 10000", c.conversations)
	case c.kvEventBatch < 1 || c.kvEventBatch > 1024:
		return fmt.Errorf("-kv-event-batch %d: between 1 and 1024", c.kvEventBatch)
	case c.warmup < 0 || c.warmup >= 0.9:
		return fmt.Errorf("-warmup %v: between 0 and 0.9", c.warmup)
	case c.sheddable < 0 || c.sheddable > 1:
		return fmt.Errorf("-sheddable %v: between 0 and 1", c.sheddable)
	case !(c.timeScale > 0 && c.timeScale <= 1000):
		return fmt.Errorf("-time-scale %v: above 0, at most 1000", c.timeScale)
	case c.servers < 1 || c.servers > 250:
		return fmt.Errorf("-servers %d: between 1 and 250", c.servers)
	case c.promptBytesPerToken < 0 || c.promptBytesPerToken > 64:
		return fmt.Errorf("-prompt-bytes-per-token %d: between 0 and 64", c.promptBytesPerToken)
	case len(c.serverSlots) > 0 && len(c.serverSlots) != c.servers, len(c.serverKVBlocks) > 0 && len(c.serverKVBlocks) != c.servers:
		return fmt.Errorf("-server-slots and -server-kv-blocks: as many as -servers (%d)", c.servers)
	case c.loraAdapters < 0 || c.loraAdapters > 64 || (c.loraAdapters > 0 && (c.maxLoRAs < 1 || c.maxLoRAs > c.loraAdapters)):
		return fmt.Errorf("-lora-adapters %d: between 0 and 64; -max-loras %d: between 1 and the adapters", c.loraAdapters, c.maxLoRAs)
	case c.slots < 1 || c.kvBlocks < 1 || c.blockTokens < 1 || c.prefixTokens < 1 || c.suffixTokens < 1 || c.outputTokens < 1:
		return fmt.Errorf("-slots, -kv-blocks, -block-size, -prefix-tokens, -suffix-tokens and -output-tokens must be positive")
	case (c.prefixTokens+c.suffixTokens+c.outputTokens+c.blockTokens-1)/c.blockTokens > c.smallestCache():
		return fmt.Errorf("a request of %d tokens does not fit in %d KV blocks of %d tokens", c.prefixTokens+c.suffixTokens+c.outputTokens, c.smallestCache(), c.blockTokens)
	case checkSim(c.sim, c.llmdBin) != nil:
		return checkSim(c.sim, c.llmdBin)
	case len(c.routers) == 0:
		return fmt.Errorf("-routers: none given")
	case len(c.routers)*len(c.replicas) > 200:
		return fmt.Errorf("-routers × -replicas: too many runs per point (at most 200)")
	case slices.Max(c.replicas) > 16:
		return fmt.Errorf("-replicas %d: at most 16", slices.Max(c.replicas))
	}
	return nil
}

// smallestCache is the fewest KV-cache blocks of a server.
func (c *sweepConfig) smallestCache() int {
	least := c.kvBlocksOf(0)
	for i := range c.servers {
		least = min(least, c.kvBlocksOf(i))
	}
	return least
}

// perServer is "n" when every server has n, else each server's, by "/".
func perServer(servers int, of func(int) int) string {
	var parts []string
	for i := range servers {
		parts = append(parts, strconv.Itoa(of(i)))
	}
	if !slices.ContainsFunc(parts, func(p string) bool { return p != parts[0] }) {
		return parts[0]
	}
	return strings.Join(parts, "/")
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0 && v < 1e6) {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// routerNames are the names -routers knows.
func routerNames() []string {
	var names []string
	for _, r := range allRouters {
		names = append(names, r.name)
	}
	return names
}

func parseRouters(s string) ([]router, error) {
	var out []router
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		name := strings.TrimSpace(f)
		found := false
		for _, r := range allRouters {
			if r.name == name {
				out, found = append(out, r), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown router %q (known: %s)", name, strings.Join(routerNames(), ", "))
		}
	}
	return out, nil
}

func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) }

func printResults(w io.Writer, rs []result, header bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if header {
		fmt.Fprintln(tw, "G\tload\treq/s\trouter\treplicas\tTTFT p50\tp90\tp99\tE2E p90\thit rate\tthroughput\tcritical TTFT p90\tsheddable shed\tunfinished\tfailed\tqueue spread\tindex confirmed\twall\t")
	}
	for _, r := range rs {
		fmt.Fprintf(tw, "%d\t%.0f%%\t%.1f\t%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t%.2f\t%s\t%d/%d\t%d\t%d\t%.1f/%.1f\t%s\t%v\t\n", r.groups, r.load*100, r.rate, r.router, max(r.replicas, 1),
			secs(r.ttft50), secs(r.ttft90), secs(r.ttft99), secs(r.e2e90), r.hitRate, r.throughput, secs(r.critTTFT90), r.shed, r.sheddable,
			r.unfinished, r.failed, r.queueSpread, r.queueTotal, r.confirmedShare(), r.wall.Round(100*time.Millisecond))
	}
	tw.Flush()
	for _, r := range rs {
		if r.waits != "" {
			fmt.Fprintf(w, "  %s: %s\n", r.series(), r.waits)
		}
		if r.firstFailure != "" {
			fmt.Fprintf(w, "  %s: first failure: %s\n", r.series(), r.firstFailure)
		}
		if r.kvEvents != "" {
			fmt.Fprintf(w, "  %s: KV events: %s\n", r.series(), r.kvEvents)
		}
	}
}

// printRatios prints, for each router of a point other than baseline, its
// TTFT percentiles over the baseline's and its hit rate less the
// baseline's (nothing when the baseline did not run).
func printRatios(w io.Writer, rs []result, baseline string) {
	i := slices.IndexFunc(rs, func(r result) bool { return r.series() == baseline })
	if i < 0 {
		return
	}
	b := rs[i]
	ratio := func(x, y time.Duration) string {
		if y <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", x.Seconds()/y.Seconds())
	}
	for _, r := range rs {
		if r.series() == baseline {
			continue
		}
		fmt.Fprintf(w, "  %s against %s: TTFT p50 %s, p90 %s, p99 %s; hit rate %+.3f\n", r.series(), baseline,
			ratio(r.ttft50, b.ttft50), ratio(r.ttft90, b.ttft90), ratio(r.ttft99, b.ttft99), r.hitRate-b.hitRate)
	}
}

// llmdRouters are the routers that are llm-d's EPP, whose better figure
// per percentile printBestRatios compares the others with.
var llmdRouters = []string{llmdRouterName, llmdPreciseRouterName}

// printBestRatios prints, for each router of a point that is not llm-d's,
// its TTFT percentiles over the lower of llm-d's routers' and its hit rate
// less the higher of theirs (nothing when no llm-d router ran).
func printBestRatios(w io.Writer, rs []result) {
	var best result
	found := false
	for _, r := range rs {
		if !slices.Contains(llmdRouters, r.series()) {
			continue
		}
		if !found {
			best, found = r, true
			continue
		}
		best.ttft50, best.ttft90, best.ttft99 = min(best.ttft50, r.ttft50), min(best.ttft90, r.ttft90), min(best.ttft99, r.ttft99)
		best.hitRate = max(best.hitRate, r.hitRate)
	}
	if !found {
		return
	}
	for _, r := range rs {
		if slices.Contains(llmdRouters, r.series()) {
			continue
		}
		fmt.Fprintf(w, "  %s against the better llm-d: TTFT p50 %.2f×, p90 %.2f×, p99 %.2f×; hit rate %+.3f\n", r.series(),
			r.ttft50.Seconds()/max(best.ttft50.Seconds(), 1e-9), r.ttft90.Seconds()/max(best.ttft90.Seconds(), 1e-9),
			r.ttft99.Seconds()/max(best.ttft99.Seconds(), 1e-9), r.hitRate-best.hitRate)
	}
}

// medians is, per router of a point, the median of each figure over the
// point's runs (each run's results in the same order of routers); the
// counts and the index's tokens are summed over the runs.
func medians(runs [][]result) []result {
	out := make([]result, len(runs[0]))
	for j := range out {
		m := runs[0][j]
		var d [5][]time.Duration
		var f [3][]float64
		m.served, m.shed, m.sheddable, m.failed, m.unfinished = 0, 0, 0, 0, 0
		m.predicted, m.confirmed, m.overPredicted, m.observed, m.eventPredicted, m.eventConfirmed, m.eventEvicted, m.fallbacks = 0, 0, 0, 0, 0, 0, 0, 0
		m.wall = 0
		for _, rs := range runs {
			r := rs[j]
			for k, v := range []time.Duration{r.ttft50, r.ttft90, r.ttft99, r.e2e90, r.critTTFT90} {
				d[k] = append(d[k], v)
			}
			for k, v := range []float64{r.hitRate, r.throughput, r.queueSpread} {
				f[k] = append(f[k], v)
			}
			m.served, m.shed, m.sheddable, m.failed, m.unfinished = m.served+r.served, m.shed+r.shed, m.sheddable+r.sheddable, m.failed+r.failed, m.unfinished+r.unfinished
			m.predicted, m.confirmed, m.overPredicted, m.observed = m.predicted+r.predicted, m.confirmed+r.confirmed, m.overPredicted+r.overPredicted, m.observed+r.observed
			m.eventPredicted, m.eventConfirmed, m.eventEvicted, m.fallbacks = m.eventPredicted+r.eventPredicted, m.eventConfirmed+r.eventConfirmed, m.eventEvicted+r.eventEvicted, m.fallbacks+r.fallbacks
			m.wall += r.wall
		}
		m.ttft50, m.ttft90, m.ttft99, m.e2e90, m.critTTFT90 = median(d[0]), median(d[1]), median(d[2]), median(d[3]), median(d[4])
		m.hitRate, m.throughput, m.queueSpread = median(f[0]), median(f[1]), median(f[2])
		m.waits, m.firstFailure, m.servers, m.kvEvents = "", "", nil, ""
		out[j] = m
	}
	return out
}

// median is the middle of xs (the mean of the two middle ones for an even
// count).
func median[T time.Duration | float64](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// loadAverage is the machine's load average over the last minute, as
// uptime prints it ("-" where /proc/loadavg is not).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// confirmedShare is the share of the cached tokens the prefix index
// predicted that the servers reported cached, with the share of requests
// it over-predicted ("-" without a prefix index or a report).
func (r *result) confirmedShare() string {
	if r.predicted == 0 || r.observed == 0 {
		return "-"
	}
	s := fmt.Sprintf("%.2f (%.0f%% over)", float64(r.confirmed)/float64(r.predicted), 100*float64(r.overPredicted)/float64(r.observed))
	if r.eventPredicted > 0 {
		s += fmt.Sprintf(", events %.3f of %d", float64(r.eventConfirmed)/float64(r.eventPredicted), r.eventPredicted)
		if r.eventEvicted > 0 {
			// What the servers held when the picks were made: the rest
			// was evicted while the requests waited.
			s += fmt.Sprintf(" (%.3f at the pick)", float64(r.eventConfirmed+r.eventEvicted)/float64(r.eventPredicted))
		}
	}
	if r.fallbacks > 0 {
		s += fmt.Sprintf(", %d untokenized", r.fallbacks)
	}
	return s
}

func markdownTable(rs []result) string {
	var b strings.Builder
	b.WriteString("| G | load | req/s | router | replicas | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | E2E p90 (s) | hit rate | throughput (req/s) | critical TTFT p90 (s) | sheddable shed | unfinished |\n")
	b.WriteString("| --: | --: | --: | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d | %.0f%% | %.1f | %s | %d | %s | %s | %s | %s | %.3f | %.2f | %s | %d/%d | %d |\n", r.groups, r.load*100, r.rate, r.router, max(r.replicas, 1),
			secs(r.ttft50), secs(r.ttft90), secs(r.ttft99), secs(r.e2e90), r.hitRate, r.throughput, secs(r.critTTFT90), r.shed, r.sheddable, r.unfinished)
	}
	return b.String()
}

type exportedResult struct {
	Groups     int     `json:"groups"`
	Load       float64 `json:"load"`
	Rate       float64 `json:"rate"`
	Router     string  `json:"router"`
	Replicas   int     `json:"replicas,omitempty"` // absent: 1
	TTFT50     float64 `json:"ttft_p50_s"`
	TTFT90     float64 `json:"ttft_p90_s"`
	TTFT99     float64 `json:"ttft_p99_s"`
	E2E90      float64 `json:"e2e_p90_s"`
	CritTTFT90 float64 `json:"critical_ttft_p90_s"`
	HitRate    float64 `json:"hit_rate"`
	Throughput float64 `json:"throughput"`
	Shed       int     `json:"shed"`
	Sheddable  int     `json:"sheddable"`
	Failed     int     `json:"failed"`
	Unfinished int     `json:"unfinished"`
	// The prefix index's predicted cached tokens and the part of them the
	// servers reported cached.
	PredictedTokens int64   `json:"index_predicted_tokens"`
	ConfirmedTokens int64   `json:"index_confirmed_tokens"`
	QueueSpread     float64 `json:"queue_spread"`
	// The same for a precise scorer's event index alone, and its picks
	// scored without the prompt's tokens.
	EventPredictedTokens int64 `json:"events_predicted_tokens,omitempty"`
	EventConfirmedTokens int64 `json:"events_confirmed_tokens,omitempty"`
	EventEvictedTokens   int64 `json:"events_evicted_after_pick_tokens,omitempty"`
	TokenizeFallbacks    int64 `json:"tokenize_fallbacks,omitempty"`
}

func (e exportedResult) result() result {
	d := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return result{groups: e.Groups, load: e.Load, rate: e.Rate, router: e.Router, replicas: max(e.Replicas, 1), ttft50: d(e.TTFT50), ttft90: d(e.TTFT90), ttft99: d(e.TTFT99),
		e2e90: d(e.E2E90), critTTFT90: d(e.CritTTFT90), hitRate: e.HitRate, throughput: e.Throughput, shed: e.Shed, sheddable: e.Sheddable,
		failed: e.Failed, unfinished: e.Unfinished, predicted: e.PredictedTokens, confirmed: e.ConfirmedTokens, queueSpread: e.QueueSpread,
		eventPredicted: e.EventPredictedTokens, eventConfirmed: e.EventConfirmedTokens, eventEvicted: e.EventEvictedTokens, fallbacks: e.TokenizeFallbacks}
}

func exported(rs []result) []exportedResult {
	out := make([]exportedResult, len(rs))
	for i, r := range rs {
		out[i] = exportedResult{r.groups, r.load, r.rate, r.router, r.replicas, r.ttft50.Seconds(), r.ttft90.Seconds(), r.ttft99.Seconds(), r.e2e90.Seconds(),
			r.critTTFT90.Seconds(), r.hitRate, r.throughput, r.shed, r.sheddable, r.failed, r.unfinished, r.predicted, r.confirmed, r.queueSpread,
			r.eventPredicted, r.eventConfirmed, r.eventEvicted, r.fallbacks}
	}
	return out
}

// routerFromConfig is the router of a -router-config (or, with peerSync,
// -peer-sync-router-config) value NAME=FILE: FILE's EndpointPickerConfig,
// checked before any fleet starts.
func routerFromConfig(v string, peerSync bool) (router, error) {
	name, file, ok := strings.Cut(v, "=")
	if !ok || name == "" || file == "" {
		return router{}, fmt.Errorf("want NAME=FILE, got %q", v)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return router{}, err
	}
	cfg, err := scheduling.LoadConfig(b)
	if err != nil {
		return router{}, err
	}
	kvEvents := slices.ContainsFunc(cfg.Plugins, func(p scheduling.PluginSpec) bool { return p.Type == prefix.PreciseType })
	return router{name: name, config: string(b), peerSync: peerSync, kvEvents: kvEvents}, nil
}

// precisePeerSync is precise's router with its replicas linked by peer
// sync, run with the numbers of replicas above 1 of its own (or, when it
// has none, of replicas).
func precisePeerSync(precise router, replicas []int) router {
	r := precise
	r.name, r.peerSync = precisePeerSyncRouterName, true
	if r.replicas != nil {
		replicas = r.replicas
	}
	r.replicas = slices.DeleteFunc(slices.Clone(replicas), func(n int) bool { return n < 2 })
	return r
}

// withKVEvents is config with each precise-prefix-cache-scorer's KV events
// read as the harness delivers them: bound at endpoint (the servers dial
// the relay, the relay this replica), each server's replay socket at
// replayPort of its pod's IP; and, unless the config names one, the
// servers' base model (modelsim.DefaultModel) as the model prompts are
// rendered for (tokenizer.modelName, as llm-d's token producer is given
// it): the servers' render endpoints refuse a LoRA adapter's name. The
// rest of the config is left as written.
func withKVEvents(config, endpoint string, replayPort int) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		return "", err
	}
	plugins, _ := doc["plugins"].([]any)
	for _, p := range plugins {
		plugin, _ := p.(map[string]any)
		if plugin == nil || plugin["type"] != prefix.PreciseType {
			continue
		}
		params := child(plugin, "parameters")
		kv := child(params, "kvEventsConfig")
		kv["zmqEndpoint"], kv["discoverPods"] = endpoint, false
		child(kv, "podDiscoveryConfig")["replaySocketPort"] = replayPort
		if tok := child(params, "tokenizer"); tok["modelName"] == nil {
			tok["modelName"] = modelsim.DefaultModel
		}
	}
	b, err := yaml.Marshal(doc)
	return string(b), err
}

// child is m[key] as a map, made when absent.
func child(m map[string]any, key string) map[string]any {
	c, _ := m[key].(map[string]any)
	if c == nil {
		c = map[string]any{}
		m[key] = c
	}
	return c
}
