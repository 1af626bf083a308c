// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package vllmpage writes realistic model-server /metrics pages (vLLM, SGLang,
// TensorRT-LLM) in the Prometheus text format, for tests, simulators and
// benchmarks.
//
// A page carries the gauges a picker reads (queue, running, KV-cache use, LoRA
// adapters, cache geometry) among the many histograms and counters a real
// server exports, and is at least Options.MinBytes long. Its contents are a
// pure function of State and Options: the same input gives the same bytes.
package vllmpage

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// Engine is a model-server family, named as in the protocols notes.
type Engine string

// Model-server families.
const (
	VLLM   Engine = "vllm"
	SGLang Engine = "sglang"
	TRTLLM Engine = "trtllm"
)

// DefaultMinBytes is the default lower bound of a page's size: about what a
// single-model vLLM server exports.
const DefaultMinBytes = 32 << 10

// DefaultModel is the model_name label used when Options.Model is empty.
const DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"

// DefaultLoRAUpdatedAt is the value (Unix seconds) of the newest LoRA info
// series when State.LoRAUpdatedAt is zero.
const DefaultLoRAUpdatedAt = 1.795968429e9

// State is what the server reports about itself right now.
type State struct {
	// Waiting is the number of queued requests.
	Waiting int
	// Running is the number of requests being decoded.
	Running int
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// RunningAdapters and WaitingAdapters are the LoRA adapters with running
	// and queued requests (vLLM only).
	RunningAdapters []string
	WaitingAdapters []string
	// MaxLoRA is how many adapters the server holds at once; zero omits the
	// LoRA info family (vLLM only).
	MaxLoRA int
	// LoRAUpdatedAt is the value of the current LoRA info series, in Unix
	// seconds, as vLLM reports it; zero means DefaultLoRAUpdatedAt.
	LoRAUpdatedAt float64
	// BlockSize is tokens per KV-cache block (SGLang: page size); zero with
	// NumGPUBlocks zero omits the cache config family (not on TRT-LLM).
	BlockSize int
	// NumGPUBlocks is the number of KV-cache blocks (SGLang: pages).
	NumGPUBlocks int
	// ServedRequests is how many requests the server has finished; it scales
	// the counters and histogram counts. Zero gives empty histograms.
	ServedRequests int
	// PrefixCacheQueries and PrefixCacheHits are the prompt tokens the
	// server looked up in its prefix cache and found there, since it
	// started (vLLM only; on the first label set, the others report none).
	// Zero both: they scale with ServedRequests as the other counters do.
	PrefixCacheQueries int
	PrefixCacheHits    int
}

// Options shape the page around the state.
type Options struct {
	// Engine is the family whose metric names are written; empty means VLLM.
	Engine Engine
	// Model is the model_name label; empty means DefaultModel.
	Model string
	// MinBytes is the smallest page to write; histogram label sets (one per
	// data-parallel engine index) are added until the page reaches it. Zero
	// means DefaultMinBytes; negative means one label set, whatever the size.
	MinBytes int
	// Seed varies histogram contents between servers with equal state.
	Seed uint64
	// LegacyKVCacheName writes vLLM's older vllm:gpu_cache_usage_perc instead
	// of vllm:kv_cache_usage_perc.
	LegacyKVCacheName bool
	// LoRAHistory is how many older LoRA info series (smaller values, other
	// adapter lists) precede the current one, as vLLM keeps every label
	// combination it ever reported. Zero means 2; negative means none.
	LoRAHistory int
}

func (o *Options) setDefaults() {
	if o.Engine == "" {
		o.Engine = VLLM
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.MinBytes == 0 {
		o.MinBytes = DefaultMinBytes
	}
	if o.LoRAHistory == 0 {
		o.LoRAHistory = 2
	}
}

// Write writes one page to w.
func Write(w io.Writer, s State, opts Options) error {
	buf := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(buf)
	buf.Reset()
	if err := appendPage(buf, s, opts); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// Page returns one page.
func Page(s State, opts Options) ([]byte, error) {
	var buf bytes.Buffer
	if err := appendPage(&buf, s, opts); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// labelSetsCache holds labelSets' answers, so a server writing pages at a
// high rate renders each page once.
var labelSetsCache sync.Map // shapeKey → int

type shapeKey struct {
	engine   Engine
	model    string
	minBytes int
}

func appendPage(buf *bytes.Buffer, s State, opts Options) error {
	opts.setDefaults()
	fams, ok := families[opts.Engine]
	if !ok {
		return fmt.Errorf("vllmpage: unknown engine %q (want vllm, sglang or trtllm)", opts.Engine)
	}
	if s.KVCacheUsage < 0 || s.KVCacheUsage > 1 || math.IsNaN(s.KVCacheUsage) {
		return fmt.Errorf("vllmpage: KV-cache usage %v outside 0..1", s.KVCacheUsage)
	}
	p := pageWriter{buf: buf, s: s, o: opts, fams: fams}
	sets := 1
	if opts.MinBytes > 0 {
		sets = labelSets(opts, fams)
	}
	p.write(sets)
	return nil
}

// labelSets is how many histogram label sets make a page of the options'
// shape reach MinBytes. It is measured on the zero state, whose numbers are
// the shortest any state writes, so every state's page reaches MinBytes and
// the count depends on the options alone (pages stay a pure function of
// their input).
func labelSets(opts Options, fams engineFamilies) int {
	key := shapeKey{opts.Engine, opts.Model, opts.MinBytes}
	if v, ok := labelSetsCache.Load(key); ok {
		return v.(int)
	}
	var buf bytes.Buffer
	p := pageWriter{buf: &buf, o: opts, fams: fams}
	sets := 1
	for {
		buf.Reset()
		p.write(sets)
		if buf.Len() >= opts.MinBytes {
			break
		}
		perSet := max(1, p.histogramBytes)
		sets += (opts.MinBytes - buf.Len() + perSet - 1) / perSet
	}
	labelSetsCache.Store(key, sets)
	return sets
}

type pageWriter struct {
	buf  *bytes.Buffer
	s    State
	o    Options
	fams engineFamilies
	// histogramBytes is the size of one label set's histogram and counter
	// samples in the last write.
	histogramBytes int
	scratch        []byte
}

func (p *pageWriter) write(sets int) {
	p.writeProcess()
	p.writeGauges()
	p.histogramBytes = 0
	for _, c := range p.fams.counters {
		p.header(c.name, c.help, "counter")
		for i := 0; i < sets; i++ {
			before := p.buf.Len()
			for j, extra := range c.extraLabels {
				share := p.s.ServedRequests * c.perRequest / max(1, len(c.extraLabels))
				if j == 0 {
					share += p.s.ServedRequests * c.perRequest % max(1, len(c.extraLabels))
				}
				p.sample(c.name, i, extra, "", float64(share))
			}
			if len(c.extraLabels) == 0 {
				v := p.s.ServedRequests * c.perRequest
				if c.value != nil && (p.s.PrefixCacheQueries != 0 || p.s.PrefixCacheHits != 0) {
					v = 0
					if i == 0 {
						v = c.value(&p.s)
					}
				}
				p.sample(c.name, i, "", "", float64(v))
			}
			if i == 0 {
				p.histogramBytes += p.buf.Len() - before
			}
		}
	}
	for _, h := range p.fams.histograms {
		p.header(h.name, h.help, "histogram")
		for i := 0; i < sets; i++ {
			before := p.buf.Len()
			p.histogram(h, i)
			if i == 0 {
				p.histogramBytes += p.buf.Len() - before
			}
		}
	}
}

func (p *pageWriter) header(name, help, typ string) {
	p.buf.WriteString("# HELP ")
	p.buf.WriteString(name)
	p.buf.WriteByte(' ')
	p.buf.WriteString(help)
	p.buf.WriteString("\n# TYPE ")
	p.buf.WriteString(name)
	p.buf.WriteByte(' ')
	p.buf.WriteString(typ)
	p.buf.WriteByte('\n')
}

// sample writes name{labels of set i, extra, le} value. extra and le may be
// empty; extra is pre-rendered `k="v"`.
func (p *pageWriter) sample(name string, set int, extra, le string, v float64) {
	b := p.buf
	b.WriteString(name)
	b.WriteByte('{')
	p.fams.seriesLabels(b, p.o.Model, set)
	if extra != "" {
		b.WriteByte(',')
		b.WriteString(extra)
	}
	if le != "" {
		b.WriteString(`,le="`)
		b.WriteString(le)
		b.WriteByte('"')
	}
	b.WriteString("} ")
	p.value(v)
	b.WriteByte('\n')
}

// value writes v as Python's prometheus_client does (1.0, 0.25, 1.5e+09).
func (p *pageWriter) value(v float64) {
	p.scratch = formatPy(p.scratch[:0], v)
	p.buf.Write(p.scratch)
}

func formatPy(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	start := len(b)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	if !bytes.ContainsAny(b[start:], ".eE") {
		b = append(b, ".0"...)
	}
	return b
}

func (p *pageWriter) writeProcess() {
	b := p.buf
	for gen, collected := range []int{11873, 2311, 107} {
		if gen == 0 {
			p.header("python_gc_objects_collected_total", "Objects collected during gc", "counter")
		}
		fmt.Fprintf(b, "python_gc_objects_collected_total{generation=\"%d\"} %d.0\n", gen, collected)
	}
	p.header("python_gc_objects_uncollectable_total", "Uncollectable objects found during GC", "counter")
	for gen := 0; gen < 3; gen++ {
		fmt.Fprintf(b, "python_gc_objects_uncollectable_total{generation=\"%d\"} 0.0\n", gen)
	}
	p.header("python_gc_collections_total", "Number of times this generation was collected", "counter")
	for gen, n := range []int{1290, 117, 9} {
		fmt.Fprintf(b, "python_gc_collections_total{generation=\"%d\"} %d.0\n", gen, n)
	}
	p.header("python_info", "Python platform information", "gauge")
	b.WriteString(`python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0` + "\n")
	for _, m := range [][3]string{
		{"process_virtual_memory_bytes", "Virtual memory size in bytes.", "3.7383450624e+010"},
		{"process_resident_memory_bytes", "Resident memory size in bytes.", "1.912963072e+09"},
		{"process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "1.79596e+09"},
		{"process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "1234.56"},
		{"process_open_fds", "Number of open file descriptors.", "97.0"},
		{"process_max_fds", "Maximum number of open file descriptors.", "1.048576e+06"},
	} {
		typ := "gauge"
		if strings.HasSuffix(m[0], "_total") {
			typ = "counter"
		}
		p.header(m[0], m[1], typ)
		b.WriteString(m[0])
		b.WriteByte(' ')
		b.WriteString(m[2])
		b.WriteByte('\n')
	}
}

func (p *pageWriter) writeGauges() {
	f := p.fams
	s := p.s
	if f.cacheConfig != "" && (s.BlockSize != 0 || s.NumGPUBlocks != 0) {
		p.header(f.cacheConfig, "Information of the LLMEngine CacheConfig.", "gauge")
		fmt.Fprintf(p.buf, "%s{%s=\"%d\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",%s=\"%d\",swap_space=\"4\"} 1.0\n",
			f.cacheConfig, f.blockSizeLabel, s.BlockSize, f.numBlocksLabel, s.NumGPUBlocks)
	}
	kv := f.kvUsage
	if p.o.LegacyKVCacheName && p.o.Engine == VLLM {
		kv = "vllm:gpu_cache_usage_perc"
	}
	p.header(kv, "Fraction of KV-cache blocks currently in use (from 0 to 1).", "gauge")
	p.sample(kv, 0, "", "", s.KVCacheUsage)
	if f.loraInfo != "" && s.MaxLoRA > 0 {
		p.header(f.loraInfo, "Running stats on lora requests.", "gauge")
		now := s.LoRAUpdatedAt
		if now == 0 {
			now = DefaultLoRAUpdatedAt
		}
		cur := [2]string{strings.Join(s.RunningAdapters, ","), strings.Join(s.WaitingAdapters, ",")}
		// Older combinations: what the adapter lists looked like before, each
		// a second older; never the current combination (one series per set).
		var older [][2]string
		for _, c := range [][2]string{{"", ""}, {cur[1], ""}, {"", cur[0]}, {cur[0], ""}, {cur[0] + "," + cur[1], ""}} {
			if len(older) >= p.o.LoRAHistory {
				break
			}
			if c != cur && !containsPair(older, c) {
				older = append(older, c)
			}
		}
		for i := len(older) - 1; i >= 0; i-- {
			p.loraSeries(f.loraInfo, s.MaxLoRA, older[i], now-float64(i+1))
		}
		p.loraSeries(f.loraInfo, s.MaxLoRA, cur, now)
	}
	p.header(f.running, "Number of requests currently running on GPU.", "gauge")
	p.sample(f.running, 0, "", "", float64(s.Running))
	p.header(f.waiting, "Number of requests waiting to be processed.", "gauge")
	p.sample(f.waiting, 0, "", "", float64(s.Waiting))
	for _, g := range f.otherGauges {
		p.header(g[0], g[1], "gauge")
		p.sample(g[0], 0, "", "", float64(len(g[0])%7)*0.125)
	}
}

func containsPair(list [][2]string, c [2]string) bool {
	for _, x := range list {
		if x == c {
			return true
		}
	}
	return false
}

func (p *pageWriter) loraSeries(name string, maxLoRA int, adapters [2]string, v float64) {
	fmt.Fprintf(p.buf, "%s{max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=%q} ", name, maxLoRA, adapters[0], adapters[1])
	p.value(v)
	p.buf.WriteByte('\n')
}

// histogram writes one label set's buckets, sum and count. Counts follow a
// smooth cumulative curve whose centre and width come from a generator seeded
// by the options seed, the family, the label set and the served count.
func (p *pageWriter) histogram(h histogramFamily, set int) {
	n := p.s.ServedRequests * max(1, h.perRequest)
	hash := fnv.New64a()
	hash.Write([]byte(h.name))
	rng := rand.New(rand.NewPCG(p.o.Seed^hash.Sum64(), uint64(set)<<32|uint64(p.s.ServedRequests)))
	centre := rng.Float64() * float64(len(h.buckets)) * 0.6
	width := 0.5 + rng.Float64()*2
	sum := 0.0
	prev := 0
	for i, le := range h.buckets {
		c := int(math.Round(float64(n) / (1 + math.Exp(-(float64(i)-centre)/width))))
		c = max(c, prev)
		if i == len(h.buckets)-1 {
			c = n
		}
		upper, _ := strconv.ParseFloat(le, 64)
		if !math.IsInf(upper, 1) {
			sum += float64(c-prev) * upper * 0.7
		}
		prev = c
		p.sample(h.name+"_bucket", set, "", le, float64(c))
	}
	p.sample(h.name+"_count", set, "", "", float64(n))
	p.sample(h.name+"_sum", set, "", "", sum)
}
