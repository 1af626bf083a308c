// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// hostilePages are pages a model server could send to make its parse cost
// more than its size: each built at n series (or labels).
var hostilePages = []struct {
	name string
	page func(n int) []byte
}{
	{"distinct series of a used family", func(n int) []byte {
		var b strings.Builder
		b.WriteString("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\n")
		for i := range n {
			fmt.Fprintf(&b, "vllm:num_requests_running{a=\"%d\"} 0\n", i)
		}
		return []byte(b.String())
	}},
	{"distinct series and one repeated", func(n int) []byte {
		var b strings.Builder
		b.WriteString("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\n")
		for i := range n {
			fmt.Fprintf(&b, "vllm:num_requests_running{a=\"%d\"} 0\n", i)
		}
		b.WriteString("vllm:num_requests_running{a=\"0\"} 0\n")
		return []byte(b.String())
	}},
	{"many labels on series of a used family", func(n int) []byte {
		var b strings.Builder
		b.WriteString("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\n")
		for i := 0; i < n; i += 32 {
			b.WriteString("vllm:num_requests_running{")
			for j := range 32 {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "l%d=\"%d\"", j, i)
			}
			b.WriteString("} 0\n")
		}
		return []byte(b.String())
	}},
	{"one series with every label", func(n int) []byte {
		var b strings.Builder
		b.WriteString("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running{")
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "l%d=\"%d\"", i, i)
		}
		b.WriteString("} 0\n")
		return []byte(b.String())
	}},
	{"an unused family's line with every label, in a page only expfmt reads", func(n int) []byte {
		var b strings.Builder
		b.WriteString("{\"vllm:num_requests_waiting\"} 1\nvllm:num_requests_running 0\nvllm:gpu_cache_usage_perc 0.5\nother{")
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("l" + strconv.Itoa(i) + "=\"x\"")
		}
		b.WriteString("} 0\n")
		return []byte(b.String())
	}},
}

// A page's parse costs CPU in proportion to its size, whatever its
// shape: four times the series (or labels) cost well under sixteen times
// the CPU, which a quadratic parse takes. The cost is read from the
// thread's CPU clock (the goroutine locked to it), so that time spent
// waiting for a core on a loaded machine does not count, and is the least
// of several parses.
func TestParseLinearInPageSize(t *testing.T) {
	if !fetch.ThreadClock {
		t.Skip("no thread CPU clock on this platform: wall time, which a loaded machine stretches, stands for CPU")
	}
	const small, runs = 3000, 7
	cost := func(p *Parser, page []byte) time.Duration {
		least := time.Duration(1<<63 - 1)
		for range runs {
			start := fetch.ThreadCPU()
			_, _ = p.Parse(page) // some of these pages are refused: the cost is what counts
			least = min(least, fetch.ThreadCPU()-start)
		}
		return least
	}
	for _, hp := range hostilePages {
		t.Run(hp.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p := NewParser(namesOf(t, DefaultEngine, MetricNameOverrides{}))
			smallPage, largePage := hp.page(small), hp.page(4*small)
			cost(p, largePage) // the parser's reused objects grown once
			c1, c4 := cost(p, smallPage), cost(p, largePage)
			ratio := float64(c4) / float64(max(c1, time.Microsecond))
			t.Logf("%d bytes %v, %d bytes %v: ratio %.1f", len(smallPage), c1, len(largePage), c4, ratio)
			if ratio > 10 {
				t.Errorf("four times the page cost %.1f times the time (%v against %v): want well under 16", ratio, c4, c1)
			}
		})
	}
}

// BenchmarkParseHostile parses the hostile pages at growing sizes: the
// time per byte stays flat.
func BenchmarkParseHostile(b *testing.B) {
	for _, hp := range hostilePages {
		for _, n := range []int{1000, 4000, 16000} {
			page := hp.page(n)
			b.Run(fmt.Sprintf("%s/%d", strings.ReplaceAll(hp.name, " ", "_"), n), func(b *testing.B) {
				p := NewParser(namesOf(b, DefaultEngine, MetricNameOverrides{}))
				b.SetBytes(int64(len(page)))
				b.ReportAllocs()
				for b.Loop() {
					_, _ = p.Parse(page)
				}
			})
		}
	}
}
