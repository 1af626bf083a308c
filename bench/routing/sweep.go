// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/scheduling"
)

// router is one scheduling configuration under comparison.
type router struct {
	name   string
	config string
	// replicas, when set, replaces the sweep's numbers of replicas for
	// this router (a baseline that needs no replicas).
	replicas []int
	// flowControl runs the picker with flow control on (flow.go).
	flowControl bool
	// external, when set, runs another endpoint picker's binary instead
	// of poolpicker (reference.go, llmdepp.go); config is unused.
	external *externalEPP
	// peerSync links the replicas with peer sync (package peersync): each
	// learns every replica's picks and in-flight counts.
	peerSync bool
	// kvEvents: the config scores from the servers' KV-cache events
	// (precise-prefix-cache-scorer); each replica gets them (-sim llm-d).
	kvEvents bool
	// admission is the picker's scheduling.Options.SaturationAdmission.
	// Empty: the default.
	admission string
}

const roundRobinConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: round-robin-picker
`

// leastQueueConfig sends each request where the fewest wait: the scraped
// queue, and poolpicker's exact in-flight count between two scrapes.
const leastQueueConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: in-flight-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: in-flight-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// upstreamConfig is the reference EPP's default profile: its weights, its
// queue and KV-cache scorers (which score as poolpicker's do: the waiting
// queue min-max normalised, 1 - KV-cache use), its max-score picker
// (ties broken at random), and its approximate prefix cache
// (upstreamPrefixType).
const upstreamConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- name: prefix-cache-scorer
  type: ` + upstreamPrefixType + `
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`

// counterAgingConfig is the default profile with the prefix scorer's
// serverCounterAging on: each replica's LRU of a server is aged by the
// blocks the server's prefix-cache counters say it cached for requests
// the replica did not record.
var counterAgingConfig = strings.Replace(scheduling.DefaultConfigText,
	"- type: prefix-cache-scorer\n  parameters:\n", "- type: prefix-cache-scorer\n  parameters:\n    serverCounterAging: true\n", 1)

// allRouters are the routers a sweep can compare, poolpicker's default first.
// The baselines run one replica: they keep no state a replica could lack,
// and the reference EPP serves from one replica (the leader) however many
// run.
var allRouters = []router{
	{name: "poolpicker", config: scheduling.DefaultConfigText},
	{name: "round-robin", config: roundRobinConfig, replicas: []int{1}},
	{name: "least-queue", config: leastQueueConfig, replicas: []int{1}},
	{name: "upstream-weights", config: upstreamConfig, replicas: []int{1}},
	{name: "poolpicker-counter-aging", config: counterAgingConfig},
	{name: "poolpicker-peer-sync", config: scheduling.DefaultConfigText, peerSync: true},
	{name: "poolpicker-all-saturated", config: scheduling.DefaultConfigText, admission: scheduling.AdmissionAllSaturated},
	flowRouter,
	referenceRouter,
	llmdRouter,
	llmdPreciseRouter,
}

// preciseRouterName is the router -precise-config adds: poolpicker with a
// configuration of precise prefix-cache routing.
const preciseRouterName = "poolpicker-precise"

// precisePeerSyncRouterName is the router -precise-peer-sync adds:
// poolpicker-precise's replicas linked by peer sync.
const precisePeerSyncRouterName = "poolpicker-precise-peer-sync"

// sweepConfig is the fleet, the workload and the points of a sweep. Every
// duration is simulated time; the servers spend it divided by timeScale.
type sweepConfig struct {
	servers, slots, kvBlocks, blockTokens int
	// serverSlots and serverKVBlocks, when set, give each server its own
	// slots and KV-cache blocks (a fleet of unequal servers), in place of
	// slots and kvBlocks; they are as long as servers.
	serverSlots, serverKVBlocks []int
	// ordinaryWords writes prompts of ordinary English words, a word a
	// token as the llm-d simulator's tokenizer counts them (about 6 bytes
	// a token), in place of short words sized by bytes (4 bytes a token).
	ordinaryWords bool
	// conversations, when set, makes the workload multi-turn chat: that
	// many conversations, each on one of the G system prompts, whose
	// every turn's prompt is the conversation so far and a new question.
	conversations int
	// runs is how many times each point runs (its figures the medians);
	// odd runs take the routers in reverse order.
	runs int
	// kvEventBatch is the llm-d simulator's --event-batch-size.
	kvEventBatch int
	// loraAdapters is the number of LoRA adapters the requests name
	// (group g's requests name adapter g mod loraAdapters), maxLoRAs how
	// many a server holds at once. Zero: the base model.
	loraAdapters, maxLoRAs int
	// promptBytesPerToken is the prompt bytes a modelsim server counts as
	// a token (0: modelsim's 4, which the prompts are sized by).
	promptBytesPerToken                      int
	prefixTokens, suffixTokens, outputTokens int
	prefillOverhead, prefillPerToken         time.Duration
	decodePerToken, scrapeInterval           time.Duration
	loadSlowdown, timeScale                  float64
	requests                                 int
	warmup, sheddable                        float64
	seed                                     uint64
	groups                                   []int
	loads                                    []float64
	routers                                  []router
	// replicas are the numbers of poolpicker replicas each router runs
	// with, side by side at every point; spread is how streams go to them.
	replicas []int
	spread   spreadMode
	parallel bool
	// sim is the model servers' simulator (simModelsim, simLLMD), llmdBin
	// the llm-d simulator's binary.
	sim, llmdBin string
	// traceDir, when set, is where each router's run writes a line per
	// request (traceRequests).
	traceDir string
}

// defaultSweep is the fleet and traffic of the issue that motivated the
// harness: 4 servers of 4 slots and 450 KV blocks of 16 tokens; prompts of
// one of G shared ~1,500-token prefixes and a short unique suffix; 30
// output tokens; prefill 30 ms + 1 ms per uncached token; decode 20 ms per
// token, 5 % slower per other running sequence.
func defaultSweep() sweepConfig {
	return sweepConfig{
		servers: 4, slots: 4, kvBlocks: 450, blockTokens: 16,
		prefixTokens: 1500, suffixTokens: 40, outputTokens: 30,
		prefillOverhead: 30 * time.Millisecond, prefillPerToken: time.Millisecond,
		decodePerToken: 20 * time.Millisecond, loadSlowdown: 0.05,
		scrapeInterval: 100 * time.Millisecond, timeScale: 2,
		requests: 500, warmup: 0.15, sheddable: 0.2, seed: 1,
		groups: []int{6, 12, 24, 48}, loads: []float64{0.5, 0.8, 1.0, 1.2},
		routers: allRouters, replicas: []int{1, 2, 3}, spread: spreadRoundRobin, parallel: true, sim: simModelsim,
		runs: 1, kvEventBatch: 1,
	}
}

// serviceTime is one request's time on a server at full hit rate with
// every slot busy: its fixed prefill, the uncached tail of the prefix and
// its suffix, and its decode steps, slowed by the other running sequences.
func (c *sweepConfig) serviceTime() time.Duration {
	cached := c.prefixTokens / c.blockTokens * c.blockTokens
	uncached := c.prefixTokens + c.suffixTokens - cached
	d := c.prefillOverhead + time.Duration(uncached)*c.prefillPerToken + time.Duration(c.outputTokens-1)*c.decodePerToken
	return time.Duration(float64(d) * (1 + c.loadSlowdown*float64(c.slots-1)))
}

// capacity is the fleet's requests per simulated second at full hit rate.
func (c *sweepConfig) capacity() float64 {
	slots := 0
	for i := range c.servers {
		slots += c.slotsOf(i)
	}
	return float64(slots) / c.serviceTime().Seconds()
}

// slotsOf is server i's sequences at once.
func (c *sweepConfig) slotsOf(i int) int {
	if i < len(c.serverSlots) {
		return c.serverSlots[i]
	}
	return c.slots
}

// kvBlocksOf is server i's KV-cache blocks.
func (c *sweepConfig) kvBlocksOf(i int) int {
	if i < len(c.serverKVBlocks) {
		return c.serverKVBlocks[i]
	}
	return c.kvBlocks
}

// model is the model group g's requests name: the base model, or a LoRA
// adapter of it.
func (c *sweepConfig) model(g int) string {
	if c.loraAdapters == 0 {
		return modelsim.DefaultModel
	}
	return loraName(g % c.loraAdapters)
}

// adapters are the LoRA adapters the servers serve (nil: none).
func (c *sweepConfig) adapters() []string {
	var out []string
	for i := range c.loraAdapters {
		out = append(out, loraName(i))
	}
	return out
}

func loraName(i int) string { return fmt.Sprintf("adapter-%d", i) }

// request is one request of a workload.
type request struct {
	at        time.Duration // simulated arrival since the start
	group     int
	conv      int // the conversation (chat), or -1
	sheddable bool
	body      []byte
}

// workload is the seeded request sequence of one point; every router gets
// the same one.
func workload(c *sweepConfig, groups int, load float64) []request {
	rnd := rand.New(rand.NewPCG(c.seed, uint64(groups)<<32|uint64(load*1000)))
	text := func(rnd *rand.Rand, head string, tokens int) string {
		if c.ordinaryWords {
			return ordinaryWords(rnd, head, tokens)
		}
		return words(rnd, head, tokens*modelsim.BytesPerToken)
	}
	prefixes := make([]string, groups)
	for g := range prefixes {
		prefixes[g] = text(rand.New(rand.NewPCG(c.seed, uint64(g)+1)), fmt.Sprintf("system prompt %d: ", g), c.prefixTokens)
	}
	rate := load * c.capacity()
	reqs := make([]request, c.requests)
	// A conversation's history: its system prompt, then each turn's
	// question and answer (the answer is the workload's own text: the
	// simulators' replies are not language).
	history := make([]string, c.conversations)
	for i := range history {
		history[i] = prefixes[i%groups]
	}
	var at time.Duration
	for i := range reqs {
		at += time.Duration(rnd.ExpFloat64() / rate * float64(time.Second))
		g := rnd.IntN(groups)
		suffix := text(rnd, fmt.Sprintf(" question %d: ", i), c.suffixTokens)
		prompt := prefixes[g] + suffix
		conv := -1
		if c.conversations > 0 {
			conv = rnd.IntN(c.conversations)
			g = conv % groups
			prompt = history[conv] + suffix
			history[conv] = prompt + text(rnd, " answer: ", c.outputTokens)
		}
		body := fmt.Sprintf(`{"model":%q,"prompt":"%s","max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`,
			c.model(g), prompt, c.outputTokens)
		reqs[i] = request{at: at, group: g, conv: conv, sheddable: rnd.Float64() < c.sheddable, body: []byte(body)}
	}
	return reqs
}

var vocabulary = strings.Fields("the of and to in is was for on that with as by at from his an were are which this be or had not but one all their has have its they new more after first who also two been other when into she time can only")

func words(rnd *rand.Rand, head string, n int) string {
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < n {
		b.WriteString(vocabulary[rnd.IntN(len(vocabulary))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// commonWords are ordinary English words of every length, as prose has
// them (about 5 letters on average).
var commonWords = strings.Fields(`people history between important government information
development question national following together business including
children problem service something although several different
because through another against however without language
system program within market nothing country second little
number public family during almost always school things around
morning evening picture station question student teacher
water world house place great where after right small large
might still every early never under while those along
should could would their there which about other these
light night point power study state order money story
young month river north south heart table party paper`)

// ordinaryWords is head and then words of commonWords up to tokens words
// (the head's words count).
func ordinaryWords(rnd *rand.Rand, head string, tokens int) string {
	var b strings.Builder
	b.WriteString(head)
	for range max(tokens-len(strings.Fields(head)), 1) {
		b.WriteString(commonWords[rnd.IntN(len(commonWords))])
		b.WriteByte(' ')
	}
	return b.String()
}

// result is one router at one point, in simulated time.
type result struct {
	groups         int
	load, rate     float64
	router         string
	replicas       int // poolpicker replicas the streams were spread over
	ttft50, ttft90 time.Duration
	ttft99, e2e90  time.Duration
	critTTFT90     time.Duration
	hitRate        float64
	throughput     float64 // completed requests per simulated second
	served, shed   int     // of the measured requests
	sheddable      int     // measured sheddable requests
	failed         int
	unfinished     int // cut off by the drain limit, counted at their wait
	firstFailure   string
	// queueSpread is the mean over time of the longest minus the shortest
	// server queue (running + waiting), queueTotal the mean of their sum.
	queueSpread, queueTotal float64
	// predicted sums, over requests whose server reported cached tokens,
	// the prompt tokens the prefix index expected cached on the picked
	// endpoint, confirmed the part of them the server had; overPredicted
	// counts the requests it expected more for, of observed.
	predicted, confirmed    int64
	overPredicted, observed int64
	// eventPredicted and eventConfirmed are the same for the predictions
	// of a precise scorer's event index alone, eventEvicted the predicted
	// tokens not confirmed whose blocks the servers evicted after the
	// pick; fallbacks counts its picks scored from the learned index for
	// want of the prompt's tokens.
	eventPredicted, eventConfirmed, eventEvicted, fallbacks int64
	wall                                                    time.Duration
	requestsMeasure                                         int
	servers                                                 []string // per-server counters, for -v
	// waits is where the measured requests waited, by priority (flow.go).
	waits string
	// kvEvents is the replicas' KV-event subscriptions' record.
	kvEvents string
}

// series names a router run with its number of replicas ("poolpicker",
// "poolpicker ×2").
func (r *result) series() string {
	if r.replicas <= 1 {
		return r.router
	}
	return fmt.Sprintf("%s ×%d", r.router, r.replicas)
}

// runPoint runs every router of c with every number of replicas on the
// point's workload, each on its own fleet: all at once with c.parallel, so
// that what the machine does meanwhile falls on them alike (the default),
// or one after the other.
//
// With reverse the routers take their turns in the opposite order (the
// results keep the routers' order).
func runPoint(ctx context.Context, c *sweepConfig, groups int, load float64, reverse bool) ([]result, error) {
	reqs := workload(c, groups, load)
	type run struct {
		router   router
		replicas int
	}
	var runs []run
	for _, r := range c.routers {
		replicas := c.replicas
		if r.replicas != nil {
			replicas = r.replicas
		}
		for _, n := range replicas {
			runs = append(runs, run{r, n})
		}
	}
	results := make([]result, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	if reverse {
		slices.Reverse(order)
	}
	for _, i := range order {
		r := runs[i]
		run := func() {
			results[i], errs[i] = runRouter(ctx, c, i, r.router, r.replicas, reqs)
			results[i].groups, results[i].load, results[i].rate = groups, load, load*c.capacity()
		}
		if !c.parallel {
			run()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sweep at G=%d load=%.0f%% %s: %w", groups, load*100, results[i].series(), err)
		}
	}
	return results, nil
}

func runRouter(ctx context.Context, c *sweepConfig, n int, r router, replicas int, reqs []request) (result, error) {
	f, err := startFleet(ctx, n, c, r, replicas)
	if err != nil {
		return result{}, err
	}
	defer f.stop()
	real := func(d time.Duration) time.Duration { return time.Duration(float64(d) / c.timeScale) }
	last := reqs[len(reqs)-1].at
	// Every run drains its backlog: a request cut off would leave the
	// percentiles, and the router that leaves more unfinished would look
	// better. Only a backlog of twenty times the run is cut off, and its
	// requests count at the time they had waited (reported as unfinished).
	cutoff := real(20*last) + time.Minute
	ctx, cancel := context.WithTimeout(ctx, cutoff)
	defer cancel()

	outs := make([]outcome, len(reqs))
	errs := make([]error, len(reqs))
	start := time.Now()
	queues := f.sampleQueues(ctx, scaled(c.scrapeInterval, c.timeScale))
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range reqs {
		if d := time.Until(start.Add(real(reqs[i].at))); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			objective := objectiveCritical
			if reqs[i].sheddable {
				objective = objectiveSheddable
			}
			outs[i], errs[i] = f.send(ctx, start.Add(real(reqs[i].at)), fmt.Sprintf("req-%d", i), objective, reqs[i].body)
		}()
	}
	wg.Wait()
	cancel()
	q := <-queues

	sim := func(d time.Duration) time.Duration { return time.Duration(float64(d) * c.timeScale) }
	res := result{router: r.name, replicas: replicas, wall: time.Since(start), queueSpread: q.spread, queueTotal: q.total}
	for _, s := range f.servers {
		res.servers = append(res.servers, s.Name()+": "+s.summary())
	}
	res.predicted, res.confirmed, res.overPredicted, res.observed = f.agreement()
	res.eventPredicted, res.eventConfirmed, res.eventEvicted, res.fallbacks = f.eventAgreement()
	res.kvEvents = f.kvEventsSummary()
	first := int(float64(len(reqs)) * c.warmup)
	res.requestsMeasure = len(reqs) - first
	windowFrom, windowTo := start.Add(real(reqs[first].at)), start.Add(real(last))
	var ttft, e2e, crit []time.Duration
	var prompt, cached, completed int
	for i := range reqs {
		o := outs[i]
		if errs[i] == nil && o.status == 200 && !o.done.Before(windowFrom) && !o.done.After(windowTo) {
			completed++
		}
		if i < first {
			continue
		}
		if reqs[i].sheddable {
			res.sheddable++
		}
		arrival := start.Add(real(reqs[i].at))
		switch {
		case errs[i] != nil && errors.Is(errs[i], context.DeadlineExceeded) && o.status != 429:
			// Cut off after waiting until the cutoff: counted at that wait.
			res.unfinished++
			waited := sim(start.Add(cutoff).Sub(arrival))
			t := waited
			if o.ttft > 0 {
				t = sim(o.ttft)
			}
			ttft, e2e = append(ttft, t), append(e2e, waited)
			if !reqs[i].sheddable {
				crit = append(crit, t)
			}
		case errs[i] != nil:
			res.failed++
			if res.firstFailure == "" {
				res.firstFailure = errs[i].Error()
			}
		case o.status == 200:
			res.served++
			ttft, e2e = append(ttft, sim(o.ttft)), append(e2e, sim(o.e2e))
			if !reqs[i].sheddable {
				crit = append(crit, sim(o.ttft))
			}
			prompt += o.promptTokens
			cached += o.cachedTokens
		case o.status == 429 && reqs[i].sheddable:
			res.shed++
		default:
			res.failed++
			if res.firstFailure == "" {
				res.firstFailure = fmt.Sprintf("request %d answered %d by the picker", i, o.status)
			}
		}
	}
	if c.traceDir != "" {
		if err := traceRequests(c.traceDir, res.series(), reqs, outs, errs, first, sim); err != nil {
			return result{}, err
		}
	}
	res.waits = waitSplit(reqs[first:], outs[first:], errs[first:], start, real, sim)
	res.ttft50, res.ttft90, res.ttft99 = quantile(ttft, 0.5), quantile(ttft, 0.9), quantile(ttft, 0.99)
	res.e2e90, res.critTTFT90 = quantile(e2e, 0.9), quantile(crit, 0.9)
	if prompt > 0 {
		res.hitRate = float64(cached) / float64(prompt)
	}
	if w := sim(windowTo.Sub(windowFrom)); w > 0 {
		res.throughput = float64(completed) / w.Seconds()
	}
	return res, nil
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(math.Ceil(q*float64(len(d))))-1)]
}

// seeded is a concurrency-safe seeded source for the scheduler.
func seeded(seed uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 7))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

// traceRequests writes a CSV line per request to a new file of dir named
// after name: its arrival, group, conversation, status, the server that
// served it, its TTFT and end-to-end time (together, each server's
// requests in flight at any instant), its prompt and cached tokens, whether it was
// measured (after the warm-up) and its error, so that a run's misses can be
// told apart.
func traceRequests(dir, name string, reqs []request, outs []outcome, errs []error, first int, sim func(time.Duration) time.Duration) error {
	f, err := os.CreateTemp(dir, strings.ReplaceAll(name, " ", "_")+".*.csv")
	if err != nil {
		return err
	}
	rows := [][]string{{"request", "arrival_s", "group", "conversation", "status", "server", "ttft_s", "e2e_s", "prompt_tokens", "cached_tokens", "measured", "error"}}
	for i, r := range reqs {
		e := ""
		if errs[i] != nil {
			e = errs[i].Error()
		}
		o := outs[i]
		rows = append(rows, []string{strconv.Itoa(i), strconv.FormatFloat(r.at.Seconds(), 'f', 3, 64), strconv.Itoa(r.group), strconv.Itoa(r.conv),
			strconv.Itoa(o.status), o.server, strconv.FormatFloat(sim(o.ttft).Seconds(), 'f', 3, 64), strconv.FormatFloat(sim(o.e2e).Seconds(), 'f', 3, 64),
			strconv.Itoa(o.promptTokens), strconv.Itoa(o.cachedTokens), strconv.FormatBool(i >= first), e})
	}
	if err := csv.NewWriter(f).WriteAll(rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
