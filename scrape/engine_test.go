// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

// fixture returns the engine's page in testdata.
func fixture(t testing.TB, e Engine) []byte {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("testdata", string(e)+".metrics"))
	if err != nil {
		t.Fatalf("engine %s has no /metrics fixture: %v", e, err)
	}
	return page
}

// fixtureMetrics is what every testdata/ENGINE.metrics page reports, as far
// as its engine's entry reads it: 3 queued and 5 running requests, a
// quarter of the KV cache in use, 1000 blocks of 16 tokens, and (newest
// LoRA series) adapters sql-lora and food-review running, tweet-summary
// waiting, at most 4.
func fixtureMetrics(n *MetricNames) datastore.Metrics {
	m := datastore.Metrics{WaitingRequests: 3, RunningRequests: 5, KVCacheUsage: 0.25}
	if n.LoRAInfo.Name != "" {
		m.RunningAdapters, m.WaitingAdapters, m.MaxAdapters = []string{"sql-lora", "food-review"}, []string{"tweet-summary"}, 4
	}
	if n.BlockSizeLabel != "" || n.BlockSize.Name != "" {
		m.BlockSize = 16
	}
	if n.NumBlocksLabel != "" || n.NumBlocks.Name != "" {
		m.NumBlocks = 1000
	}
	return m
}

// A new engine is one entry of the table plus its page in testdata: every
// entry reads its fixture to the values the fixture reports, on the fast
// path and on expfmt's, and every fixture belongs to an entry.
func TestEveryEngineReadsItsFixture(t *testing.T) {
	for _, e := range engines {
		t.Run(string(e.Name), func(t *testing.T) {
			page := fixture(t, e.Name)
			for _, full := range []bool{false, true} {
				p := NewParser(e.Metrics)
				p.fullParse = full
				got, err := p.Parse(page)
				if err != nil {
					t.Fatalf("full=%v: %v", full, err)
				}
				if want := fixtureMetrics(&e.Metrics); !reflect.DeepEqual(got, want) {
					t.Errorf("full=%v: got %+v, want %+v", full, got, want)
				}
			}
			// The entry's names and aliases select it, in any case.
			for _, v := range append([]string{string(e.Name)}, e.Aliases...) {
				if got, err := ParseEngine(strings.ToUpper(v)); err != nil || got != e.Name {
					t.Errorf("ParseEngine(%q) = %q, %v", v, got, err)
				}
			}
			// Each required family is one the page must have: without it the
			// page is refused, naming the selector.
			for _, req := range []Metric{e.Metrics.Waiting, e.Metrics.Running} {
				var kept []string
				for _, line := range strings.SplitAfter(string(page), "\n") {
					if !strings.HasPrefix(line, req.Name) || !seriesSelected(line, req) {
						kept = append(kept, line)
					}
				}
				if _, err := NewParser(e.Metrics).Parse([]byte(strings.Join(kept, ""))); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", req.String())) {
					t.Errorf("page without %s: error %v, want it named", req, err)
				}
			}
		})
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".metrics")
		if _, err := ParseEngine(name); err != nil {
			t.Errorf("fixture %s belongs to no engine entry: %v", f, err)
		}
	}
	if len(files) != len(engines) {
		t.Errorf("%d fixtures for %d engines", len(files), len(engines))
	}
}

// seriesSelected reports whether a sample line of the selector's family
// carries the selector's label values (the fixtures quote every value).
func seriesSelected(line string, m Metric) bool {
	for k, v := range m.Match {
		if !strings.Contains(line, k+`="`+v+`"`) {
			return false
		}
	}
	return true
}

// Every engine is documented in the metrics page's table, and the page says
// how to add one.
func TestMetricsDocListsEveryEngine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "site-src", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range engines {
		if !strings.Contains(string(doc), "| `"+string(e.Name)+"`") {
			t.Errorf("site-src/metrics.md has no table row for engine %s", e.Name)
		}
	}
	for _, s := range []string{LabelEngineType, LabelModelServerEngine, "scrape/engine.go", "scrape/testdata"} {
		if !strings.Contains(string(doc), s) {
			t.Errorf("site-src/metrics.md does not mention %s", s)
		}
	}
}

// Every engine is picked by each way of naming it, over real HTTP: the
// upstream picker's pod label, poolpicker's own pod label, the pool's
// annotation, in that order of strength from the weakest.
func TestEngineSelection(t *testing.T) {
	servers := startModelServers(t, len(engines))
	for i, e := range engines {
		servers[i].serve(200, fixture(t, e.Name))
	}
	port := servers[0].port
	h := newHarness(t, Options{})
	type choice struct {
		ann, upstream, own string
	}
	before := time.Now()
	var checks []func(t *testing.T)
	for i, e := range engines {
		other := engines[(i+1)%len(engines)].Name
		for j, c := range []choice{
			{upstream: string(e.Name)},
			{ann: string(other), upstream: string(e.Name)},
			{upstream: string(other), own: string(e.Name)},
			{ann: string(e.Name)},
		} {
			if e.Name == DefaultEngine && c == (choice{ann: string(e.Name)}) {
				c = choice{} // no name at all picks the default
			}
			ann := map[string]string{}
			if c.ann != "" {
				ann[AnnotationModelServerEngine] = c.ann
			}
			labels := map[string]string{}
			if c.upstream != "" {
				labels[LabelEngineType] = c.upstream
			}
			if c.own != "" {
				labels[LabelModelServerEngine] = c.own
			}
			p := h.reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: string(e.Name) + "-" + string(rune('a'+j))},
				&datastore.PoolSpec{TargetPorts: []int32{int32(port)}, Annotations: ann})
			p.SetPods(pods(labels, servers[i]))
			s, c := servers[i], c
			checks = append(checks, func(t *testing.T) {
				h.await(t, fmt.Sprintf("a good scrape of %s for pool %s", s.addr, p.Key), func(ev scrapeEvent) bool {
					return ev.pool == p.Key && ev.address == s.addr && ev.err == nil
				})
				m := endpointOf(t, p, s.addr).Metrics()
				if m.ScrapedAt.Before(before) {
					t.Fatalf("%+v: not scraped", c)
				}
				got := *m
				got.ScrapedAt, got.Interval = time.Time{}, 0
				if want := fixtureMetrics(&e.Metrics); !reflect.DeepEqual(got, want) {
					t.Errorf("%s by %+v: got %+v, want %+v", e.Name, c, got, want)
				}
			})
		}
	}
	for _, check := range checks {
		check(t)
	}
}

func TestParseMetric(t *testing.T) {
	tests := []struct {
		in      string
		want    Metric
		wantErr string
	}{
		{in: "vllm:num_requests_waiting", want: Metric{Name: "vllm:num_requests_waiting"}},
		{in: " q {} ", want: Metric{Name: "q"}},
		{in: `"sglang:num_queue_reqs"`, want: Metric{Name: "sglang:num_queue_reqs"}},
		{in: `"m{a="b"}"`, want: Metric{Name: "m", Match: map[string]string{"a": "b"}}},
		{in: "nv_trt_llm_request_metrics{request_type=waiting}", want: Metric{Name: "nv_trt_llm_request_metrics", Match: map[string]string{"request_type": "waiting"}}},
		{in: `m{a="x,y}", b = z ,c=""}`, want: Metric{Name: "m", Match: map[string]string{"a": "x,y}", "b": "z", "c": ""}}},
		{in: `m{a="q\"\\\n"}`, want: Metric{Name: "m", Match: map[string]string{"a": "q\"\\\n"}}},
		{in: "", wantErr: "want a metric name first"},
		{in: "9lives", wantErr: "want a metric name first"},
		{in: "m{a!=b}", wantErr: "want label=value"},
		{in: "m{a=~b}", wantErr: "want label=value"},
		{in: "m{a=b", wantErr: "want only label matchers in braces"},
		{in: "m x", wantErr: "want only label matchers in braces"},
		{in: "m{a=b c=d}", wantErr: "want a comma"},
		{in: `m{a="b}`, wantErr: "unterminated"},
		{in: `m{a="\x"}`, wantErr: "badly escaped"},
		{in: "m{a=b,a=c}", wantErr: "matched twice"},
		{in: "m{:a=b}", wantErr: "want a label name"},
	}
	for _, tt := range tests {
		got, err := ParseMetric(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.in)) {
				t.Errorf("ParseMetric(%q) error %v, want one naming the input and %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseMetric(%q) = %#v, %v; want %#v", tt.in, got, err, tt.want)
		}
	}
	// A bad override is refused when the manager is made.
	if _, err := NewManager(Options{MetricNames: MetricNameOverrides{TotalQueuedRequests: "q{a!=b}"}}); err == nil || !strings.Contains(err.Error(), `"q{a!=b}"`) {
		t.Errorf("NewManager with a bad override: %v", err)
	}
}

// FuzzParseMetric: any input is refused or read, and what is read writes
// back to a selector that reads the same.
func FuzzParseMetric(f *testing.F) {
	for _, e := range engines {
		for _, m := range []Metric{e.Metrics.Waiting, e.Metrics.Running, e.Metrics.KVCacheUsage} {
			f.Add(m.String())
		}
	}
	for _, s := range []string{`m{a="x,y}", b = z ,c=""}`, `m{a="q\"\\\n"}`, "m{a=b,", "m{", "{a=b}", `m{a="`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMetric(s)
		if err != nil {
			return
		}
		again, err := ParseMetric(m.String())
		if err != nil || !again.equal(m) {
			t.Fatalf("%q read as %#v, written %q, read back %#v, %v", s, m, m.String(), again, err)
		}
	})
}
