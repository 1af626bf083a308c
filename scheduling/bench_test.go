package scheduling

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/poolpicker/poolpicker/datastore"
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
func benchPool(b *testing.B, s *Scheduler) *testPool {
	tp := newTestPool(b, benchEndpoints, s)
	for i, e := range tp.pool.Endpoints().Endpoints {
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
		p := append(prompt(fmt.Sprintf("system prompt %d", i%8), benchPromptBytes/2),
			prompt(fmt.Sprintf("conversation %d", i), benchPromptBytes/2)...)
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
		if _, err := s.Schedule(ctx, tp.pool, &reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	if !novel {
		runPicks(b, s, tp.pool, func(i int) *Request { return &reqs[i%len(reqs)] })
		return
	}
	// Every request ends in 1 KB never seen before: 16 new blocks to record.
	buf := make([]byte, benchPromptBytes)
	req := Request{Model: "lora-1", Prompt: buf}
	runPicks(b, s, tp.pool, func(i int) *Request {
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
		if _, err := s.Schedule(ctx, tp.pool, &Request{Model: "lora-1", Prompt: p}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			req := Request{Model: "lora-1", Prompt: prompts[i%len(prompts)]}
			if _, err := s.Schedule(ctx, tp.pool, &req); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkPrefixIndexBytesPerBlock measures the heap held by the prefix
// index per cached (block, endpoint) entry, with runtime.MemStats: blocks
// held by one endpoint each (distinct prompts), and blocks held by 4
// endpoints each (a shared system prompt), where one index entry serves 4
// LRU entries.
func BenchmarkPrefixIndexBytesPerBlock(b *testing.B) {
	for _, holders := range []int{1, 4} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) {
			const perEndpoint = 20000
			var perEntry float64
			for n := 0; n < b.N; n++ {
				s := build(b, PrefixCacheScorerType, `{"lruCapacityPerServer": 1000000, "autoTune": false}`).(*prefixCacheScorer)
				tp := newTestPool(b, benchEndpoints, nil)
				eps := tp.pool.Endpoints().Endpoints
				hashes := make([]uint64, perEndpoint)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				x := s.index(tp.pool)
				for i, e := range eps {
					group := i / holders
					for j := range hashes {
						hashes[j] = uint64(group)<<32 | uint64(j)
					}
					pe := x.endpointFor(tp.pool, e, 1000000)
					pe.record(hashes, 1000000, 0)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				entries := len(eps) * perEndpoint
				if got := x.blocks(); got != entries/holders {
					b.Fatalf("index holds %d blocks, want %d", got, entries/holders)
				}
				perEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(entries)
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "bytes/entry")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkPrefixDropEndpoint measures forgetting one endpoint whose LRU is
// full at the default capacity (31250 blocks), as happens synchronously in
// the registry's observer call when a pod leaves.
func BenchmarkPrefixDropEndpoint(b *testing.B) {
	hashes := make([]uint64, DefaultLRUCapacityPerServer)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		s := build(b, PrefixCacheScorerType, "").(*prefixCacheScorer)
		tp := newTestPool(b, 2, nil)
		x := s.index(tp.pool)
		e := tp.pool.Endpoints().Endpoints[0]
		x.endpointFor(tp.pool, e, DefaultLRUCapacityPerServer).record(hashes, DefaultLRUCapacityPerServer, 0)
		b.StartTimer()
		x.drop([]*datastore.Endpoint{e})
		b.StopTimer()
		if x.blocks() != 0 {
			b.Fatal("blocks left after drop")
		}
	}
}

// BenchmarkRecord measures recording a 256-block prompt (16 KiB, the
// default cap) on an endpoint holding 20,000 blocks, against touching each
// block in turn (each-block, the way record worked before it moved a
// leading run at once), in the same run:
//   - repeat: the prompt the endpoint served last, again (a retry, or the
//     same request from many clients);
//   - next-turn: the last prompt's first 240 blocks, then 16 new ones (a
//     conversation's next turn, cut at the cap);
//   - shared-prefix: a 192-block system prompt the endpoint served last,
//     then 64 blocks of its own.
func BenchmarkRecord(b *testing.B) {
	const capacity, blocks = 1 << 20, 256
	tp := newTestPool(b, 1, nil)
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		name   string
		shared int // leading blocks of the last prompt each prompt repeats
	}{{"repeat", blocks}, {"next-turn", blocks - 16}, {"shared-prefix", 192}} {
		for _, eachBlock := range []bool{true, false} {
			name := c.name + "/run"
			if eachBlock {
				name = c.name + "/each-block"
			}
			b.Run(name, func(b *testing.B) {
				x := newPrefixIndex()
				pe := x.endpointFor(tp.pool, tp.pool.Endpoints().Endpoints[0], capacity)
				pe.record(randomBlocks(rnd, 20000), capacity, 0)
				prompts := make([][]uint64, 64)
				last := randomBlocks(rnd, blocks)
				for i := range prompts {
					prompts[i] = append(slices.Clone(last[:c.shared]), randomBlocks(rnd, blocks-c.shared)...)
				}
				pe.record(last, capacity, 0)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					p := prompts[i%len(prompts)]
					if eachBlock {
						pe.mu.Lock()
						pe.touchOrAdd(p)
						pe.mu.Unlock()
					} else {
						pe.record(p, capacity, 0)
					}
					b.StopTimer()
					pe.record(last, capacity, 0) // the endpoint's last prompt again
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkHashPrompt hashes a 16 KiB prompt into 256 chained block hashes
// with the runtime's hash, against xxhash (what hashPrompt used before) in
// the same run.
func BenchmarkHashPrompt(b *testing.B) {
	p := prompt("abc", 16<<10)
	dst := make([]uint64, 0, 256)
	seed := maphash.MakeSeed()
	b.Run("maphash", func(b *testing.B) {
		for b.Loop() {
			dst = hashPrompt(seed, dst[:0], "m", p, 64, 256)
		}
	})
	b.Run("xxhash", func(b *testing.B) {
		for b.Loop() {
			dst = dst[:0]
			prev := xxhash.Sum64String("m")
			for i := 0; i < 256; i++ {
				prev = chainHash(prev, xxhash.Sum64(p[i*64:(i+1)*64]))
				dst = append(dst, prev)
			}
		}
	})
}
