// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import "time"

// Metrics is one scrape of a model server, immutable once published.
type Metrics struct {
	// WaitingRequests is the number of requests queued in the server.
	WaitingRequests int
	// RunningRequests is the number of requests the server is decoding.
	RunningRequests int
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// RunningAdapters are the LoRA adapters the server is running requests for.
	RunningAdapters []string
	// WaitingAdapters are the LoRA adapters requests are queued for.
	WaitingAdapters []string
	// MaxAdapters is how many adapters the server can hold at once; 0 unknown.
	MaxAdapters int
	// BlockSize is the number of tokens per KV-cache block; 0 unknown.
	BlockSize int
	// NumBlocks is the number of KV-cache blocks of the server; 0 unknown.
	NumBlocks int
	// PrefixCacheQueries and PrefixCacheHits are the server's counters of
	// prompt tokens looked up in its prefix cache and found there, since
	// it started (vLLM's vllm:prefix_cache_queries_total and _hits_total):
	// their difference grows by the tokens it computed and cached. Both 0:
	// unknown.
	PrefixCacheQueries float64
	PrefixCacheHits    float64
	// ScrapedAt is when the scrape that produced these values finished.
	ScrapedAt time.Time
	// Interval is the time until the server's next scrape when these values
	// were published: the refresh interval while its pools get requests,
	// longer while they are idle. Zero means the refresh interval.
	Interval time.Duration
}

// HasAdapter reports whether the adapter is running or waiting on the server.
func (m *Metrics) HasAdapter(name string) (running, waiting bool) {
	for _, a := range m.RunningAdapters {
		if a == name {
			running = true
			break
		}
	}
	for _, a := range m.WaitingAdapters {
		if a == name {
			waiting = true
			break
		}
	}
	return running, waiting
}

// Fresh reports whether m exists and was scraped within staleness of now,
// or within two of its scrape intervals when that is longer: an idle pool's
// servers are scraped rarely, and their last values, with poolpicker's own
// in-flight counts, are what is known of them. A nil or stale snapshot
// means the endpoint's load is unknown, never zero.
func (m *Metrics) Fresh(now time.Time, staleness time.Duration) bool {
	return m != nil && now.Sub(m.ScrapedAt) <= max(staleness, 2*m.Interval)
}
