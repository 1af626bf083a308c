// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// testdata holds small tokenizer.json files (package tokenize's).
const testdata = "../../../tokenize/testdata"

func TestNewPreciseParameters(t *testing.T) {
	for _, tt := range []struct {
		name, params, wantErr string
	}{
		{name: "llm-d's defaults: dial each endpoint at 5557", params: `{}`},
		{name: "llm-d's simulator dials the picker", params: `{"tokenProcessorConfig":{"blockSizeTokens":16,"hashSeed":"42"},"kvEventsConfig":{"zmqEndpoint":"tcp://127.0.0.1:0","discoverPods":false}}`},
		{name: "indexer settings read past, speculative indexing", params: `{"indexerConfig":{"kvBlockIndexConfig":{"enableMetrics":true}},"speculativeIndexing":true,"speculativeTTL":"2s","kvEventsConfig":{"engineType":"sglang","concurrency":4}}`},
		{name: "speculativeTTL unreadable", params: `{"speculativeIndexing":true,"speculativeTTL":"soon"}`, wantErr: "speculativeTTL"},
		{name: "speculativeTTL too long", params: `{"speculativeIndexing":true,"speculativeTTL":"2m"}`, wantErr: "speculativeTTL 2m0s"},
		{name: "speculativeTTL zero", params: `{"speculativeTTL":"0s"}`, wantErr: "speculativeTTL 0s"},
		{name: "estimate backend", params: `{"tokenizer":{"backend":"estimate"}}`},
		{name: "the base model rendered for", params: `{"tokenizer":{"modelName":"Qwen/Qwen3-0.6B","url":"http://127.0.0.1:9"}}`},
		{name: "the base model, llm-d's tokenizersPoolConfig spelling", params: `{"indexerConfig":{"tokenizersPoolConfig":{"modelName":"Qwen/Qwen3-0.6B"}}}`},
		{name: "local tokenizers, llm-d's config", params: `{"indexerConfig":{"tokenizersPoolConfig":{"minPrefixOverlapRatio":0.85,"local":{"autoDiscoveryDir":"` + testdata + `","modelTokenizerMap":{"m":"` + testdata + `/sentencepiece/tokenizer.json"}}}},"tokenizer":{"backend":"local"}}`},
		{name: "local backend without tokenizers", params: `{"indexerConfig":{"tokenizersPoolConfig":{"local":{"autoDiscoveryDir":"` + testdata + `/absent"}}},"tokenizer":{"backend":"local"}}`, wantErr: "finds no tokenizer"},
		{name: "an unreadable local tokenizer", params: `{"indexerConfig":{"tokenizersPoolConfig":{"local":{"autoDiscoveryDir":"` + testdata + `/absent","modelTokenizerMap":{"m":"` + testdata + `/expected.json"}}}}}`, wantErr: `local tokenizer of "m"`},
		{name: "overlap ratio beyond 1", params: `{"indexerConfig":{"tokenizersPoolConfig":{"minPrefixOverlapRatio":2}}}`, wantErr: "minPrefixOverlapRatio 2"},
		{name: "block size too big", params: `{"tokenProcessorConfig":{"blockSize":100000}}`, wantErr: "blockSize 100000"},
		{name: "unknown hash", params: `{"tokenProcessorConfig":{"hashAlgorithm":"sha256"}}`, wantErr: `hash algorithm "sha256"`},
		{name: "unknown backend", params: `{"tokenizer":{"backend":"hf"}}`, wantErr: `tokenizer.backend "hf"`},
		{name: "timeout too long", params: `{"tokenizer":{"timeout":"5s"}}`, wantErr: "tokenizer.timeout 5s"},
		{name: "unknown engine", params: `{"kvEventsConfig":{"engineType":"trt"}}`, wantErr: `engineType "trt"`},
		{name: "no source of events", params: `{"kvEventsConfig":{"discoverPods":false}}`, wantErr: "no events would arrive"},
		{name: "unknown field", params: `{"blockSize":16}`, wantErr: "unknown field"},
		{name: "bad approximate parameters", params: `{"approximate":{"hashBlockSize":-1}}`, wantErr: "approximate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := prefix.NewPrecise("p", []byte(tt.params), framework.NewHandle(ctx, logr.Discard(), nil))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.TypedName(); got.Type != prefix.PreciseType || got.Name != "p" {
				t.Errorf("TypedName = %v", got)
			}
		})
	}
}

// TestPreciseLearnedParams: a precise config without an approximate block
// (llm-d's) gets the default profile's learned-index rules; one with the
// block gets exactly what it says.
func TestPreciseLearnedParams(t *testing.T) {
	for _, tt := range []struct {
		name, params                string
		queueCost, room, rendezvous int
	}{
		{"absent: the default profile's", `{}`, 192, 384, 4},
		{"null: the default profile's", `{"approximate":null}`, 192, 384, 4},
		{"given: replaces them whole", `{"approximate":{"queueCostTokens":100}}`, 100, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := prefix.NewPrecise("p", []byte(tt.params), framework.NewHandle(ctx, logr.Discard(), nil))
			if err != nil {
				t.Fatal(err)
			}
			got := p.(*prefix.Precise).LearnedParams()
			if got.QueueCostTokens != tt.queueCost || got.QueueCostTokensWithRoom != tt.room || got.RendezvousBlocks != tt.rendezvous {
				t.Errorf("queueCostTokens %d, queueCostTokensWithRoom %d, rendezvousBlocks %d; want %d, %d, %d",
					got.QueueCostTokens, got.QueueCostTokensWithRoom, got.RendezvousBlocks, tt.queueCost, tt.room, tt.rendezvous)
			}
		})
	}
}
