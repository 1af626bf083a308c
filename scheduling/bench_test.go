// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// Benchmarks of a pick on a 100-endpoint pool with 4 KB prompts.
//
//	go test -run '^$' -bench . -benchmem ./scheduling/
//
// Each Schedule benchmark reports, besides ns/op and allocs/op, the p50 and
// p99 latency of single picks (p50-ns, p99-ns) measured over all b.N picks.
// BenchmarkScheduleRandomPicker is the baseline of the same run: the same
// pool, request and Schedule path with the random picker and no scorer.

const (
	benchEndpoints   = 100
	benchPromptBytes = 4096
	// benchConversations is the number of distinct prompts cycled through; 8
	// system prompts of 2 KB each shared by 32 conversations.
	benchConversations = 256
)

const randomOnlyConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
`

// smallLRUConfig is the default profile with LRUs small enough that a
// stream of novel prompts reaches the eviction steady state in a benchmark.
const smallLRUConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: in-flight-scorer
- type: lora-affinity-scorer
- type: prefix-cache-scorer
  parameters:
    lruCapacityPerServer: 2000
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: in-flight-scorer
  - pluginRef: lora-affinity-scorer
  - pluginRef: prefix-cache-scorer
    weight: 3
`

// benchPool is a 100-endpoint pool with varied, fresh metrics and adapters.
func benchPool(b *testing.B, s *Scheduler) *schedtest.Pool {
	tp := newTestPool(b, benchEndpoints, s)
	for i, e := range tp.Pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{
			WaitingRequests: i % 7,
			RunningRequests: 10 + i%13,
			KVCacheUsage:    float64(i%10) / 12,
			RunningAdapters: []string{fmt.Sprintf("lora-%d", i%5), fmt.Sprintf("lora-%d", (i+1)%5)},
			MaxAdapters:     4,
			BlockSize:       16,
			NumBlocks:       30000,
			ScrapedAt:       time.Now(),
		})
		e.AddInFlight(int64(i % 3))
	}
	return tp
}

func benchPrompts() [][]byte {
	out := make([][]byte, benchConversations)
	for i := range out {
		p := append(schedtest.Prompt(fmt.Sprintf("system prompt %d", i%8), benchPromptBytes/2),
			schedtest.Prompt(fmt.Sprintf("conversation %d", i), benchPromptBytes/2)...)
		out[i] = p
	}
	return out
}

// runPicks schedules b.N requests, timing each, and reports percentiles of
// wall time (p50-ns, p99-ns) and of the thread's CPU time (p50-cpu-ns,
// p99-cpu-ns): on a machine shared with other work, wall-time tails mostly
// measure preemption; CPU time measures the pick.
func runPicks(b *testing.B, s *Scheduler, pool *datastore.Pool, next func(i int) *Request) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lat := make([]time.Duration, b.N)
	cpu := make([]int64, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := next(i)
		c0 := threadCPUTime()
		start := time.Now()
		if _, err := s.Schedule(ctx, pool, req); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
		cpu[i] = threadCPUTime() - c0
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(cpu)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu[len(cpu)/2]), "p50-cpu-ns")
	b.ReportMetric(float64(cpu[len(cpu)*99/100]), "p99-cpu-ns")
}

func benchSchedule(b *testing.B, config string, novel bool, opts ...func(*Options)) {
	o := Options{MetricsStaleness: time.Hour}
	for _, f := range opts {
		f(&o)
	}
	s := mustScheduler(b, config, o)
	tp := benchPool(b, s)
	prompts := benchPrompts()
	reqs := make([]Request, len(prompts))
	for i := range reqs {
		reqs[i] = Request{ID: "bench", Model: fmt.Sprintf("lora-%d", i%5), Objective: "chat", Prompt: prompts[i]}
	}
	// Warm up: every conversation has been served once, as in steady traffic.
	for i := range reqs {
		if _, err := s.Schedule(ctx, tp.Pool, &reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	if !novel {
		runPicks(b, s, tp.Pool, func(i int) *Request { return &reqs[i%len(reqs)] })
		return
	}
	// Every request ends in 1 KB never seen before: 16 new blocks to record.
	buf := make([]byte, benchPromptBytes)
	req := Request{Model: "lora-1", Prompt: buf}
	runPicks(b, s, tp.Pool, func(i int) *Request {
		copy(buf, prompts[i%len(prompts)][:3072])
		for j := 3072; j < len(buf); j += 8 {
			v := uint64(i)*0x9e3779b97f4a7c15 + uint64(j)
			for k := 0; k < 8; k++ {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		return &req
	})
}

// BenchmarkScheduleDefaultProfile: the full default profile, prompts whose
// blocks are all cached (steady state of recurring conversations).
func BenchmarkScheduleDefaultProfile(b *testing.B) { benchSchedule(b, "", false) }

// BenchmarkScheduleDefaultProfileTimed: the same with every plugin call
// timed (Options.PluginDuration), as cmd/poolpicker runs it.
func BenchmarkScheduleDefaultProfileTimed(b *testing.B) {
	var total atomic.Int64
	benchSchedule(b, "", false, func(o *Options) {
		o.PluginDuration = func(string, TypedName) func(time.Duration) {
			return func(d time.Duration) { total.Add(int64(d)) }
		}
	})
}

// BenchmarkScheduleDefaultProfileAsBefore: the default profile's plugins
// with every parameter added since the request path was reshaped turned
// off (bench/routing/configs/before48.yaml), so that a build of today is
// timed on the rules an older build's DefaultProfile ran.
func BenchmarkScheduleDefaultProfileAsBefore(b *testing.B) {
	benchSchedule(b, defaultProfileAsBefore, false)
}

const defaultProfileAsBefore = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: subset-filter
- type: queue-scorer
- type: in-flight-scorer
  parameters:
    perCacheSize: false
- type: lora-affinity-scorer
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 64
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
    queueCostTokens: 192
    rendezvousBlocks: 4
    rendezvousLoadSlack: 8
    tokenScaledCapacity: false
    rendezvousByCacheSize: false
    loadPerCacheSize: false
    rendezvousBalanceCache: false
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: subset-filter
  - pluginRef: queue-scorer
    weight: 0.5
  - pluginRef: in-flight-scorer
    weight: 0.5
  - pluginRef: lora-affinity-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`

// BenchmarkScheduleNovelSuffix: the default profile with 2000-block LRUs;
// every prompt ends in 1 KB never seen, so each pick records 16 new blocks
// and evicts as many.
func BenchmarkScheduleNovelSuffix(b *testing.B) { benchSchedule(b, smallLRUConfig, true) }

// BenchmarkScheduleRandomPicker is the baseline: no scorer, random pick.
func BenchmarkScheduleRandomPicker(b *testing.B) { benchSchedule(b, randomOnlyConfig, false) }

// BenchmarkScheduleParallel runs the default profile from GOMAXPROCS
// goroutines on one pool: nothing on the path is a global lock.
func BenchmarkScheduleParallel(b *testing.B) {
	s := mustScheduler(b, "", Options{MetricsStaleness: time.Hour})
	tp := benchPool(b, s)
	prompts := benchPrompts()
	for _, p := range prompts {
		if _, err := s.Schedule(ctx, tp.Pool, &Request{Model: "lora-1", Prompt: p}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			req := Request{Model: "lora-1", Prompt: prompts[i%len(prompts)]}
			if _, err := s.Schedule(ctx, tp.Pool, &req); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
