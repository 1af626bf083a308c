// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package schedbench compares scheduling profiles on a simulated pool of
// model servers: how much of each prompt the chosen server already had
// cached, and how long requests waited.
//
//	go test -run '^$' -bench . ./bench/scheduling/
//
// The simulation is deterministic (seeded) and runs in virtual time: each
// server runs up to 8 requests at once, a request's work is a fixed decode
// cost plus prefill of the prompt blocks the server did not have cached
// (its true cache is an LRU of block hashes, as a vLLM prefix cache is),
// and metrics are "scraped" every 5 ticks. The scheduler under test is the
// real one, on a real datastore pool; only the servers are simulated.
package schedbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
)

const (
	simServers       = 20
	simSlots         = 8    // requests a server runs at once
	simCacheBlocks   = 1500 // a server's true prefix cache, in 64-byte blocks
	simBlock         = 64
	simTicks         = 3000 // of the benchmark
	simScrapeEvery   = 5
	simConversations = 600
	simGroups        = 12   // distinct system prompts
	simSystemBytes   = 2048 // per system prompt
	simTurnBytes     = 384  // added to a conversation per turn
	simMaxTurns      = 12
	simArrivalsPer   = 9 // requests per tick, on average
	simDecodeTicks   = 6 // work of a request besides prefill
	simPrefillPer    = 8 // uncached blocks prefilled per tick
)

const loadOnlyConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: in-flight-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: in-flight-scorer
`

const randomConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
`

type simRequest struct {
	arrived int
	work    int
}

type simServer struct {
	ep      *datastore.Endpoint
	cache   *simplelru.LRU[uint64, struct{}]
	running []simRequest
	waiting []simRequest
}

type simResult struct {
	hitRatio    float64
	meanLatency float64
	p99Latency  int
	maxQueue    int
}

func seeded(seed uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 7))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

func text(seed string, n int) []byte {
	b := make([]byte, 0, n)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%s %d; ", seed, i)
	}
	return b[:n]
}

// blockHashes is the simulated server's own block hashing: chained, like
// vLLM's, and independent of the scheduler's.
func blockHashes(p []byte) []uint64 {
	var out []uint64
	buf := make([]byte, 8+simBlock)
	prev := uint64(0)
	for i := 0; i+simBlock <= len(p); i += simBlock {
		binary.LittleEndian.PutUint64(buf, prev)
		copy(buf[8:], p[i:i+simBlock])
		prev = xxhash.Sum64(buf)
		out = append(out, prev)
	}
	return out
}

func simulate(t testing.TB, config string, ticks int) simResult {
	cfg, err := scheduling.LoadConfig([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(cfg, scheduling.Options{Rand: seeded(1)})
	if err != nil {
		t.Fatal(err)
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(sched)
	pool := reg.Upsert(datastore.PoolKey{Namespace: "sim", Name: "pool"}, &datastore.PoolSpec{TargetPorts: []int32{8000}})
	var pods []datastore.EndpointSource
	for i := 0; i < simServers; i++ {
		pods = append(pods, datastore.EndpointSource{
			Pod: types.NamespacedName{Namespace: "sim", Name: fmt.Sprintf("s%d", i)},
			UID: types.UID(fmt.Sprintf("u%d", i)), IP: fmt.Sprintf("127.0.2.%d", i+1),
		})
	}
	pool.SetPods(pods)
	servers := make([]*simServer, 0, simServers)
	byAddr := map[string]*simServer{}
	for _, e := range pool.Endpoints().Endpoints {
		c, _ := simplelru.NewLRU[uint64, struct{}](simCacheBlocks, nil)
		s := &simServer{ep: e, cache: c}
		servers = append(servers, s)
		byAddr[e.Address] = s
	}
	system := make([][]byte, simGroups)
	for g := range system {
		system[g] = text(fmt.Sprintf("system prompt %d", g), simSystemBytes)
	}
	history := make([][]byte, simConversations)
	for c := range history {
		history[c] = text(fmt.Sprintf("conversation %d", c), simMaxTurns*simTurnBytes)
	}
	turns := make([]int, simConversations)
	rnd := rand.New(rand.NewPCG(2, 3))

	var hitBlocks, allBlocks int
	var latencies []int
	maxQueue := 0
	scrape := func() {
		for _, s := range servers {
			s.ep.SetMetrics(&datastore.Metrics{
				WaitingRequests: len(s.waiting),
				RunningRequests: len(s.running),
				KVCacheUsage:    float64(len(s.running)) / simSlots * 0.9,
				ScrapedAt:       time.Now(),
			})
			maxQueue = max(maxQueue, len(s.waiting))
		}
	}
	scrape()
	for tick := 0; tick < ticks; tick++ {
		for a := 0; a < simArrivalsPer*2; a++ {
			if rnd.IntN(2) == 0 { // on average simArrivalsPer per tick
				continue
			}
			c := rnd.IntN(simConversations)
			turns[c] = turns[c]%simMaxTurns + 1
			p := append(append([]byte{}, system[c%simGroups]...), history[c][:turns[c]*simTurnBytes]...)
			res, err := sched.ScheduleDeferred(context.Background(), pool, &scheduling.Request{Model: "m", Prompt: p})
			if err != nil {
				t.Fatal(err)
			}
			res.Commit()
			s := byAddr[res.Endpoints[0].Address]
			s.ep.AddInFlight(1)
			hashes := blockHashes(p)
			hit := 0
			for _, h := range hashes {
				if _, ok := s.cache.Get(h); !ok {
					break
				}
				hit++
			}
			for i := len(hashes) - 1; i >= 0; i-- {
				s.cache.Add(hashes[i], struct{}{})
			}
			hitBlocks += hit
			allBlocks += len(hashes)
			req := simRequest{arrived: tick, work: simDecodeTicks + (len(hashes)-hit+simPrefillPer-1)/simPrefillPer}
			if len(s.running) < simSlots {
				s.running = append(s.running, req)
			} else {
				s.waiting = append(s.waiting, req)
			}
		}
		for _, s := range servers {
			kept := s.running[:0]
			for _, r := range s.running {
				r.work--
				if r.work > 0 {
					kept = append(kept, r)
					continue
				}
				latencies = append(latencies, tick-r.arrived)
				s.ep.AddInFlight(-1)
			}
			s.running = kept
			for len(s.running) < simSlots && len(s.waiting) > 0 {
				s.running = append(s.running, s.waiting[0])
				s.waiting = s.waiting[1:]
			}
		}
		if tick%simScrapeEvery == 0 {
			scrape()
		}
	}
	slices.Sort(latencies)
	sum := 0
	for _, l := range latencies {
		sum += l
	}
	return simResult{
		hitRatio:    float64(hitBlocks) / float64(allBlocks),
		meanLatency: float64(sum) / float64(len(latencies)),
		p99Latency:  latencies[len(latencies)*99/100],
		maxQueue:    maxQueue,
	}
}

func BenchmarkSimulatedPool(b *testing.B) {
	for _, c := range []struct{ name, config string }{
		{"default-profile", scheduling.DefaultConfigText},
		{"load-only", loadOnlyConfig},
		{"random", randomConfig},
	} {
		b.Run(c.name, func(b *testing.B) {
			var r simResult
			for i := 0; i < b.N; i++ {
				r = simulate(b, c.config, simTicks)
			}
			b.ReportMetric(r.hitRatio*100, "%cached")
			b.ReportMetric(r.meanLatency, "mean-ticks")
			b.ReportMetric(float64(r.p99Latency), "p99-ticks")
			b.ReportMetric(float64(r.maxQueue), "max-queue")
		})
	}
}

// TestDefaultProfileBeatsBaselines checks the claim the benchmark measures:
// on the same workload the default profile caches more of each prompt than
// the baselines and serves faster than random.
func TestDefaultProfileBeatsBaselines(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	// Shorter than the benchmark's run: the test runs under -race in CI.
	const ticks = 600
	def := simulate(t, scheduling.DefaultConfigText, ticks)
	load := simulate(t, loadOnlyConfig, ticks)
	rnd := simulate(t, randomConfig, ticks)
	t.Logf("default %+v\nload-only %+v\nrandom %+v", def, load, rnd)
	if def.hitRatio <= load.hitRatio || def.hitRatio <= rnd.hitRatio {
		t.Fatalf("default profile cached %.2f of prompt blocks; load-only %.2f, random %.2f", def.hitRatio, load.hitRatio, rnd.hitRatio)
	}
	if def.meanLatency >= rnd.meanLatency {
		t.Fatalf("default profile mean latency %.1f ticks, random %.1f", def.meanLatency, rnd.meanLatency)
	}
}
