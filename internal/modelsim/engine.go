// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"container/list"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// engine is the server's scheduler: a FIFO waiting queue in front of at most
// maxNumSeqs running sequences, the KV cache they hold and the LoRA adapter
// slots. One mutex guards it all; requests only touch it when they arrive,
// are admitted and finish, never per token.
type engine struct {
	maxNumSeqs int
	maxLoRAs   int
	hasLoRA    bool
	now        func() time.Time

	// pub, when set, publishes the cache's events (KVEventsOptions).
	pub *kvPublisher

	mu      sync.Mutex
	kv      *kvCache
	waiting list.List // of *sequence, oldest first
	running int
	// runningByAdapter counts running sequences per LoRA adapter.
	runningByAdapter map[string]int
	// loaded are the adapters occupying slots, least recently used first.
	loaded []string
	// loraUpdatedAt is the Unix time at which the running or waiting adapter
	// lists last changed: vLLM's value of the lora_requests_info series.
	loraUpdatedAt  float64
	lastRunning    []string
	lastWaiting    []string
	stats          Stats
	servedRequests int
}

// sequence is one request inside the engine.
type sequence struct {
	// model is the requested model; adapter is the LoRA adapter, empty for
	// the base model.
	model        string
	adapter      string
	hashes       []blockHash
	meta         *blockMeta
	promptTokens int
	totalBlocks  int

	// Set at admission, under the engine lock, before admitted is closed.
	admitted      chan struct{}
	alloc         allocation
	admittedAt    time.Time
	loadedAdapter bool
	elem          *list.Element
}

// Stats are counters of a server since it started, for tests and logs.
type Stats struct {
	// Requests is the number of inference requests admitted to run.
	Requests int
	// Completed is the number of requests that produced all their tokens.
	Completed int
	// Cancelled is the number of requests whose client went away first.
	Cancelled int
	// ByModel counts admitted requests per model name (base or adapter).
	ByModel map[string]int
	// PromptTokens and CachedPromptTokens sum the prompt tokens of admitted
	// requests and those found in the prefix cache.
	PromptTokens       int
	CachedPromptTokens int
	// AdapterLoads counts LoRA adapter loads (a request needed an adapter that
	// held no slot).
	AdapterLoads int
	// PeakRunning and PeakWaiting are the largest running and waiting counts seen.
	PeakRunning int
	PeakWaiting int
}

func newEngine(o *Options) *engine {
	return &engine{
		maxNumSeqs:       o.MaxNumSeqs,
		maxLoRAs:         o.MaxLoRAs,
		hasLoRA:          len(o.LoRAAdapters) > 0,
		now:              time.Now,
		kv:               newKVCache(o.BlockSizeTokens, o.NumGPUBlocks),
		runningByAdapter: map[string]int{},
		stats:            Stats{ByModel: map[string]int{}},
	}
}

// run queues seq and waits until it is admitted. It returns ctx's error, with
// the sequence removed from the queue or released, when ctx ends first. After
// a nil return the caller must call finish exactly once.
func (e *engine) run(ctx context.Context, seq *sequence) error {
	seq.admitted = make(chan struct{})
	e.mu.Lock()
	seq.elem = e.waiting.PushBack(seq)
	e.stats.PeakWaiting = max(e.stats.PeakWaiting, e.waiting.Len())
	e.schedule()
	e.loraChanged()
	e.mu.Unlock()

	select {
	case <-seq.admitted:
		return nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-seq.admitted:
		// Admitted while the context ended: give the slot back.
		e.releaseLocked(seq)
		e.stats.Cancelled++
	default:
		e.waiting.Remove(seq.elem)
		e.stats.Cancelled++
		e.schedule()
	}
	e.loraChanged()
	return ctx.Err()
}

// finish ends an admitted sequence; completed says whether it produced all
// its tokens.
func (e *engine) finish(seq *sequence, completed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.releaseLocked(seq)
	if completed {
		e.stats.Completed++
		e.servedRequests++
	} else {
		e.stats.Cancelled++
	}
	e.loraChanged()
}

func (e *engine) releaseLocked(seq *sequence) {
	e.running--
	if seq.adapter != "" {
		e.runningByAdapter[seq.adapter]--
		if e.runningByAdapter[seq.adapter] == 0 {
			delete(e.runningByAdapter, seq.adapter)
		}
	}
	e.kv.release(seq.alloc)
	e.schedule()
}

// schedule admits waiting sequences in FIFO order while a sequence slot is
// free. A sequence that does not fit in the KV cache stops admission (it
// keeps its place at the head); one whose adapter has no free slot is skipped
// so that it does not block other adapters, as vLLM's scheduler does.
func (e *engine) schedule() {
	for el := e.waiting.Front(); el != nil && e.running < e.maxNumSeqs; {
		seq := el.Value.(*sequence)
		next := el.Next()
		evict, ok := e.adapterSlot(seq.adapter)
		if !ok {
			el = next
			continue
		}
		alloc, ok := e.kv.allocate(seq.hashes, seq.meta, seq.promptTokens, seq.totalBlocks)
		e.flushEvents()
		if !ok {
			return
		}
		if seq.adapter != "" && !slices.Contains(e.loaded, seq.adapter) {
			if evict >= 0 {
				e.loaded = slices.Delete(e.loaded, evict, evict+1)
			}
			seq.loadedAdapter = true
			e.stats.AdapterLoads++
		} else if seq.adapter != "" {
			e.loaded = slices.DeleteFunc(e.loaded, func(a string) bool { return a == seq.adapter })
		}
		if seq.adapter != "" {
			e.loaded = append(e.loaded, seq.adapter) // most recently used last
			e.runningByAdapter[seq.adapter]++
		}
		seq.alloc = alloc
		seq.admittedAt = e.now()
		e.waiting.Remove(el)
		e.running++
		e.stats.Requests++
		e.stats.ByModel[seq.model]++
		e.stats.PromptTokens += seq.promptTokens
		e.stats.CachedPromptTokens += alloc.cachedTokens
		e.stats.PeakRunning = max(e.stats.PeakRunning, e.running)
		close(seq.admitted)
		el = next
	}
}

// flushEvents hands the cache's recorded events to the publisher.
func (e *engine) flushEvents() {
	if e.pub != nil && len(e.kv.events) > 0 {
		e.pub.publish(e.kv.events)
		e.kv.events = nil
	}
}

// adapterSlot reports whether adapter can run now and, when loading it needs
// a slot another idle adapter holds, that adapter's index in loaded (-1: no
// eviction needed).
func (e *engine) adapterSlot(adapter string) (evict int, ok bool) {
	if adapter == "" || slices.Contains(e.loaded, adapter) {
		return -1, true
	}
	if len(e.loaded) < e.maxLoRAs {
		return -1, true
	}
	for i, a := range e.loaded { // least recently used first
		if e.runningByAdapter[a] == 0 {
			return i, true
		}
	}
	return -1, false
}

// loraChanged stamps the time at which the adapter lists changed, the value
// vLLM gives its newest lora_requests_info series.
func (e *engine) loraChanged() {
	if !e.hasLoRA {
		return
	}
	running, waiting := e.adapterListsLocked()
	if slices.Equal(running, e.lastRunning) && slices.Equal(waiting, e.lastWaiting) && e.loraUpdatedAt != 0 {
		return
	}
	e.lastRunning, e.lastWaiting = running, waiting
	ts := float64(e.now().UnixNano()) / 1e9
	// Strictly increasing, so the newest series always wins a scrape.
	e.loraUpdatedAt = max(ts, e.loraUpdatedAt+1e-6)
}

func (e *engine) adapterListsLocked() (running, waiting []string) {
	for a := range e.runningByAdapter {
		running = append(running, a)
	}
	seen := map[string]bool{}
	for el := e.waiting.Front(); el != nil; el = el.Next() {
		if a := el.Value.(*sequence).adapter; a != "" && !seen[a] {
			seen[a] = true
			waiting = append(waiting, a)
		}
	}
	slices.Sort(running)
	slices.Sort(waiting)
	return running, waiting
}

// runningCount is the number of running sequences, which sets the per-step
// slowdown.
func (e *engine) runningCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running
}

// state is what the /metrics page reports.
func (e *engine) state(maxLoRAs int) vllmpage.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := vllmpage.State{
		Waiting:        e.waiting.Len(),
		Running:        e.running,
		KVCacheUsage:   float64(e.kv.usedBlocks()) / float64(e.kv.totalBlocks),
		BlockSize:      e.kv.blockTokens,
		NumGPUBlocks:   e.kv.totalBlocks,
		ServedRequests: e.servedRequests,
		// vLLM counts a request's prompt tokens and its cache hits when it
		// is scheduled, as admission does here.
		PrefixCacheQueries: e.stats.PromptTokens,
		PrefixCacheHits:    e.stats.CachedPromptTokens,
	}
	if e.hasLoRA {
		s.RunningAdapters = slices.Clone(e.lastRunning)
		s.WaitingAdapters = slices.Clone(e.lastWaiting)
		s.MaxLoRA = maxLoRAs
		s.LoRAUpdatedAt = e.loraUpdatedAt
	}
	return s
}

func (e *engine) snapshot() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.ByModel = make(map[string]int, len(e.stats.ByModel))
	for k, v := range e.stats.ByModel {
		s.ByModel[k] = v
	}
	return s
}

// loadedAdapters are the adapters holding slots, least recently used first.
func (e *engine) loadedAdapters() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.loaded)
}
