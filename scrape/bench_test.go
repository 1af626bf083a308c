// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

var benchSizes = []struct {
	name     string
	minBytes int
}{{"32KB", vllmpage.DefaultMinBytes}, {"200KB", 200 << 10}}

// BenchmarkParse compares the fast path with expfmt's parse of the whole
// page (the baseline), on real-size vLLM pages.
func BenchmarkParse(b *testing.B) {
	for _, size := range benchSizes {
		page := mustPage(b, richState, vllmpage.Options{MinBytes: size.minBytes})
		for _, mode := range []struct {
			name string
			full bool
		}{{"fast", false}, {"expfmt", true}} {
			b.Run(fmt.Sprintf("%s/%s", size.name, mode.name), func(b *testing.B) {
				p := NewParser(namesOf(b, DefaultEngine, MetricNameOverrides{}))
				p.fullParse = mode.full
				b.SetBytes(int64(len(page)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Parse(page); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkScrape is one scrape and parse over keep-alive HTTP from a
// loopback server (whose CPU, the same in both modes, is included).
func BenchmarkScrape(b *testing.B) {
	for _, size := range benchSizes {
		page := mustPage(b, richState, vllmpage.Options{MinBytes: size.minBytes})
		for _, mode := range []struct {
			name string
			full bool
		}{{"fast", false}, {"expfmt", true}} {
			b.Run(fmt.Sprintf("%s/%s", size.name, mode.name), func(b *testing.B) {
				servers, err := listenAll(1)
				if err != nil {
					b.Fatal(err)
				}
				s := servers[0]
				defer s.srv.Close()
				s.serve(http.StatusOK, page)
				m, err := NewManager(Options{DisableFastPath: mode.full})
				if err != nil {
					b.Fatal(err)
				}
				defer m.transport.CloseIdleConnections()
				reg := datastore.NewRegistry()
				p := reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: "bench"}, &datastore.PoolSpec{TargetPorts: []int32{int32(s.port)}})
				p.SetPods(pods(nil, s))
				srv := newServer(&m.opts, buildTarget(&m.opts, p.Spec(), p.Endpoints().Endpoints[0]))
				defer m.dropConn(srv)
				tp := startPoller(b, m)
				b.SetBytes(int64(len(page)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := tp.fetch(srv); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkCPUClockSpan is the cost of timing one span (two reads of the
// thread's CPU clock and of the wall clock): a poller times each wake-up,
// which works on many scrapes, and one https scrape in timedEvery is timed.
func BenchmarkCPUClockSpan(b *testing.B) {
	var c cpuClock
	c.start(true)
	for b.Loop() {
		c.end(c.begin())
	}
}

// BenchmarkPlan is one plan of the budget's shares at ten thousand pools of
// five servers, a hundred of them busy: the plan runs every second on the
// dispatcher, holding the manager's lock.
func BenchmarkPlan(b *testing.B) {
	m, reg := unstartedManager(b)
	const pools, podsPerPool, busy = 10000, 5, 100
	var hot []*datastore.Pool
	for i := range pools {
		ips := make([]string, podsPerPool)
		for j := range ips {
			ips[j] = fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1)
		}
		if p := addIPPool(reg, fmt.Sprintf("pool-%d", i), ips...); i%(pools/busy) == 0 {
			hot = append(hot, p)
		}
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range hot {
		m.demandLocked(p, now)
	}
	for b.Loop() {
		m.planLocked(now)
	}
}
