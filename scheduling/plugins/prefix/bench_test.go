// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// Benchmarks of the prefix index's parts:
//
//	go test -run '^$' -bench . -benchmem ./scheduling/plugins/prefix/

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
				s := build(b, `{"lruCapacityPerServer": 1000000, "autoTune": false, "maxIndexBytes": -1}`)
				tp := schedtest.NewPool(b, 100)
				eps := tp.Pool.Endpoints().Endpoints
				hashes := make([]uint64, perEndpoint)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				x := s.index(dsview.Pool(tp.Pool))
				for i, e := range eps {
					group := i / holders
					for j := range hashes {
						hashes[j] = uint64(group)<<32 | uint64(j)
					}
					pe := x.endpointFor(dsview.Pool(tp.Pool), dsview.Endpoint(e), 1000000)
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
		s := build(b, "")
		tp := schedtest.NewPool(b, 2)
		x := s.index(dsview.Pool(tp.Pool))
		e := tp.Pool.Endpoints().Endpoints[0]
		x.endpointFor(dsview.Pool(tp.Pool), dsview.Endpoint(e), DefaultLRUCapacityPerServer).record(hashes, DefaultLRUCapacityPerServer, 0)
		b.StartTimer()
		x.drop([]framework.Endpoint{dsview.Endpoint(e)})
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
	tp := schedtest.NewPool(b, 1)
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
				// Under the default memory budget, as the scorer records.
				budget := fairshare.New(fairshare.Options{Name: "bench", Capacity: DefaultMaxIndexBytes / indexBytesPerBlock})
				x := newPrefixIndex(budget.Party("ns", "pool"))
				pe := x.endpointFor(dsview.Pool(tp.Pool), dsview.Endpoint(tp.Pool.Endpoints().Endpoints[0]), capacity)
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
	p := schedtest.Prompt("abc", 16<<10)
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

// BenchmarkScoreServerCounterAging scores a 4 KiB prompt over 8 endpoints
// that each hold it, with serverCounterAging off and on, in the same run,
// between scrapes (each endpoint's sample already seen): what the aging
// costs every pick.
func BenchmarkScoreServerCounterAging(b *testing.B) {
	const pods = 8
	prompt := schedtest.Prompt("system", 4096)
	for _, c := range []struct{ name, params string }{
		{"off", `{}`},
		{"on", `{"serverCounterAging": true}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := build(b, c.params)
			tp := schedtest.NewPool(b, pods)
			for i := 1; i <= pods; i++ {
				m := schedtest.Load(0, 0.1)
				m.PrefixCacheQueries, m.PrefixCacheHits = 2e6, 1e6
				tp.Ep(b, i).SetMetrics(m)
			}
			cands := schedtest.Candidates(tp.Pool)
			scores := make([]float64, len(cands))
			for i := 1; i <= pods; i++ {
				cs := schedtest.NewCycle(tp.Pool, "m", 1)
				s.Score(ctx, cs, &framework.Request{Prompt: prompt}, cands, scores)
				s.PostPick(ctx, cs, &framework.Request{Prompt: prompt}, &framework.Result{Endpoints: []framework.Endpoint{dsview.Endpoint(tp.Ep(b, i))}})
			}
			cs := schedtest.NewCycle(tp.Pool, "m", 1)
			req := &framework.Request{Prompt: prompt}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Score(ctx, cs, req, cands, scores)
			}
		})
	}
}
