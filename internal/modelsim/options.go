// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
)

// Defaults of Options.
const (
	DefaultModel            = "meta-llama/Llama-3.1-8B-Instruct"
	DefaultMaxNumSeqs       = 16
	DefaultBlockSizeTokens  = 16
	DefaultNumGPUBlocks     = 2048
	DefaultMaxModelLenToks  = 8192
	DefaultMaxLoRAs         = 1
	DefaultMaxTokens        = 32
	DefaultPrefillPerToken  = 100 * time.Microsecond
	DefaultDecodePerToken   = 10 * time.Millisecond
	DefaultLoadSlowdown     = 0.05
	DefaultLoRALoadLatency  = 20 * time.Millisecond
	DefaultMetricsPageBytes = 32 << 10
	// BytesPerToken is how many prompt bytes the simulator counts as one
	// token: about what byte-pair tokenizers average on English text. The
	// simulator has no vocabulary, so token counts are len(prompt)/4 rounded up.
	BytesPerToken = 4
)

// Options configure a Server. The zero value of every field means its
// documented default (all bound to flags in cmd/modelsim).
type Options struct {
	// Addr is the host:port to listen on, e.g. "127.0.0.2:8000". Empty:
	// "127.0.0.1:0" (any free port on loopback). Ignored when Listener is set.
	Addr string
	// Listener, when set, is served instead of binding Addr; Stop closes it.
	Listener net.Listener

	// Model is the base model name served (and the model_name metric label).
	// Empty: DefaultModel.
	Model string
	// LoRAAdapters are the adapter names requests may ask for in "model",
	// like vLLM's --lora-modules. Empty: none (only the base model is served).
	LoRAAdapters []string
	// MaxLoRAs is how many adapters can be loaded at once (vLLM --max-loras);
	// a request for an adapter that is not loaded waits while every slot holds
	// an adapter with running requests. Zero: 1.
	MaxLoRAs int
	// LoRALoadLatency is added to the time to first token of a request whose
	// adapter had to be loaded. Zero: 20ms; negative: none.
	LoRALoadLatency time.Duration

	// MaxNumSeqs is how many requests run (are prefilled or decoded) at once
	// (vLLM --max-num-seqs); the rest wait in FIFO order. Zero: 16.
	MaxNumSeqs int
	// BlockSizeTokens is the number of tokens in a KV-cache block. Zero: 16.
	BlockSizeTokens int
	// PromptBytesPerToken is how many prompt bytes count as one token: what
	// the usage's prompt and cached tokens, and the KV-cache blocks, are
	// counted in. Zero: BytesPerToken. Another value stands for a tokenizer
	// whose tokens a client cannot guess from the bytes.
	PromptBytesPerToken int
	// NumGPUBlocks is the number of KV-cache blocks. A request holds blocks for
	// its prompt and its maximum output while it runs. Zero: 2048.
	NumGPUBlocks int
	// MaxModelLenTokens bounds prompt plus output tokens of one request
	// (vLLM --max-model-len); longer requests are answered 400. Zero: 8192,
	// or the whole KV cache when that is smaller.
	MaxModelLenTokens int
	// DisablePrefixCaching makes every prompt block a miss (vLLM
	// --no-enable-prefix-caching).
	DisablePrefixCaching bool

	// DefaultMaxTokens is the output length of requests that give no
	// max_tokens. Zero: 32.
	DefaultMaxTokens int
	// PrefillPerToken is the time to prefill one uncached prompt token with a
	// single sequence running. Zero: 100µs; negative: no prefill time.
	PrefillPerToken time.Duration
	// PrefillOverhead is the fixed part of every request's prefill, paid
	// however much of the prompt is cached (a forward pass's launch and
	// scheduling cost). Zero: none.
	PrefillOverhead time.Duration
	// DecodePerToken is the time between output tokens with a single sequence
	// running. Zero: 10ms; negative: no decode time.
	DecodePerToken time.Duration
	// LoadSlowdown is the fractional increase of prefill and decode time per
	// additional running sequence: with n running, a step takes
	// (1 + LoadSlowdown*(n-1)) times its single-sequence time. Zero: 0.05;
	// negative: no slowdown.
	LoadSlowdown float64
	// TimeScale divides every simulated duration (prefill, decode, adapter
	// loads) when it is spent: a server at 10 runs ten times faster than the
	// costs it is given, so a benchmark simulates an hour in six minutes.
	// What it reports (metrics, usage, token counts) does not change. Zero: 1.
	TimeScale float64
	// Jitter is the largest fractional random variation (seeded) of each step's
	// time, e.g. 0.1 for ±10%. Zero: none.
	Jitter float64

	// Seed makes generated text, output lengths and jitter reproducible.
	Seed uint64
	// MetricsPageBytes is the least size of the /metrics page, filled with the
	// histograms a real vLLM exports. Zero: 32 KiB; negative: gauges and one
	// label set of histograms only.
	MetricsPageBytes int
	// KVEvents, when set, makes the server publish its KV-cache events and
	// key its prompt blocks by token ids as llm-d does (see
	// KVEventsOptions). Nil: no events, blocks keyed by prompt bytes.
	KVEvents *KVEventsOptions
	// Name identifies the server in responses (header x-modelsim-server) and
	// logs. Empty: the listening address.
	Name string
	// Logger receives one line per request at V(4). Zero: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.MaxLoRAs <= 0 {
		o.MaxLoRAs = DefaultMaxLoRAs
	}
	if o.LoRALoadLatency == 0 {
		o.LoRALoadLatency = DefaultLoRALoadLatency
	}
	if o.MaxNumSeqs <= 0 {
		o.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if o.BlockSizeTokens <= 0 {
		o.BlockSizeTokens = DefaultBlockSizeTokens
	}
	if o.PromptBytesPerToken == 0 {
		o.PromptBytesPerToken = BytesPerToken
	}
	if o.NumGPUBlocks <= 0 {
		o.NumGPUBlocks = DefaultNumGPUBlocks
	}
	if o.MaxModelLenTokens <= 0 {
		o.MaxModelLenTokens = min(DefaultMaxModelLenToks, o.NumGPUBlocks*o.BlockSizeTokens)
	}
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = DefaultMaxTokens
	}
	if o.PrefillPerToken == 0 {
		o.PrefillPerToken = DefaultPrefillPerToken
	}
	if o.DecodePerToken == 0 {
		o.DecodePerToken = DefaultDecodePerToken
	}
	if o.LoadSlowdown == 0 {
		o.LoadSlowdown = DefaultLoadSlowdown
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.MetricsPageBytes == 0 {
		o.MetricsPageBytes = DefaultMetricsPageBytes
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
}

// validate rejects options no server could run with.
func (o *Options) validate() error {
	seen := map[string]bool{o.Model: true}
	for _, a := range o.LoRAAdapters {
		if a == "" {
			return fmt.Errorf("modelsim: empty LoRA adapter name")
		}
		if seen[a] {
			return fmt.Errorf("modelsim: LoRA adapter %q listed twice or equal to the base model", a)
		}
		seen[a] = true
	}
	if o.Jitter < 0 || o.Jitter >= 1 {
		return fmt.Errorf("modelsim: jitter %v outside [0, 1)", o.Jitter)
	}
	if !(o.TimeScale > 0 && o.TimeScale <= 1e6) {
		return fmt.Errorf("modelsim: time scale %v outside (0, 1e6]", o.TimeScale)
	}
	if o.PromptBytesPerToken < 1 || o.PromptBytesPerToken > 64 {
		return fmt.Errorf("modelsim: prompt bytes per token %d outside [1, 64]", o.PromptBytesPerToken)
	}
	if o.PrefillOverhead < 0 {
		return fmt.Errorf("modelsim: negative prefill overhead %v", o.PrefillOverhead)
	}
	if o.MaxModelLenTokens > o.NumGPUBlocks*o.BlockSizeTokens {
		return fmt.Errorf("modelsim: max model length %d tokens does not fit in the KV cache (%d blocks of %d tokens)",
			o.MaxModelLenTokens, o.NumGPUBlocks, o.BlockSizeTokens)
	}
	return nil
}
