// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// ParseArgs reads a simulator command line, with flags named like vLLM's
// where vLLM has one (--model, --port, --max-num-seqs, --lora-modules...),
// into Options. It is shared by cmd/modelsim and by local setups that run
// the container args of a model-server Deployment in-process. verbosity is
// the -v flag.
func ParseArgs(args []string, stderr io.Writer) (opts Options, verbosity int, err error) {
	fs := flag.NewFlagSet("modelsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &opts
	host := fs.String("host", "127.0.0.1", "IP address to listen on (use a distinct loopback IP per simulated pod: 127.0.0.2, 127.0.0.3, ...)")
	port := fs.Int("port", 8000, "port to listen on")
	fs.StringVar(&o.Model, "model", DefaultModel, "base model name")
	lora := fs.String("lora-modules", "", "comma-separated LoRA adapter names the server can serve (name or name=path; the path is ignored)")
	fs.IntVar(&o.MaxLoRAs, "max-loras", DefaultMaxLoRAs, "LoRA adapters loaded at once")
	fs.DurationVar(&o.LoRALoadLatency, "lora-load-latency", DefaultLoRALoadLatency, "extra time to first token when an adapter must be loaded (negative: none)")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", DefaultMaxNumSeqs, "requests running at once; the rest wait in FIFO order")
	fs.IntVar(&o.BlockSizeTokens, "block-size", DefaultBlockSizeTokens, "tokens per KV-cache block")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", DefaultNumGPUBlocks, "KV-cache blocks")
	fs.IntVar(&o.PromptBytesPerToken, "prompt-bytes-per-token", BytesPerToken, "prompt bytes counted as one token (usage and KV-cache blocks)")
	fs.IntVar(&o.MaxModelLenTokens, "max-model-len", 0, "longest prompt+output in tokens (0: 8192 or the whole KV cache if smaller)")
	noPrefix := fs.Bool("no-enable-prefix-caching", false, "disable prefix caching")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", DefaultMaxTokens, "output length of requests without max_tokens")
	fs.DurationVar(&o.PrefillPerToken, "prefill-time-per-token", DefaultPrefillPerToken, "prefill time per uncached prompt token with one request running (negative: none)")
	fs.DurationVar(&o.PrefillOverhead, "prefill-overhead", 0, "fixed prefill time of every request, however much of its prompt is cached")
	fs.Float64Var(&o.TimeScale, "time-scale", 1, "divide every simulated duration by this factor (10: run ten times faster than the simulated costs)")
	fs.DurationVar(&o.DecodePerToken, "time-per-output-token", DefaultDecodePerToken, "time between output tokens with one request running (negative: none)")
	fs.Float64Var(&o.LoadSlowdown, "load-slowdown", DefaultLoadSlowdown, "fractional slowdown of each step per additional running request (negative: none)")
	fs.Float64Var(&o.Jitter, "jitter", 0, "largest random fractional variation of step times, e.g. 0.1")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of generated text, output lengths and jitter")
	fs.IntVar(&o.MetricsPageBytes, "metrics-page-bytes", DefaultMetricsPageBytes, "least size of the /metrics page (negative: gauges and one histogram set only)")
	fs.StringVar(&o.Name, "name", "", "server name in the x-modelsim-server response header (default: the listen address)")
	fs.IntVar(&verbosity, "v", 0, "log verbosity (4: one line per request)")
	if err := fs.Parse(args); err != nil {
		return opts, 0, err
	}
	if fs.NArg() > 0 {
		return opts, 0, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *port < 0 || *port > 65535 {
		return opts, 0, fmt.Errorf("--port %d outside 0..65535", *port)
	}
	if net.ParseIP(*host) == nil {
		return opts, 0, fmt.Errorf("--host %q is not an IP address", *host)
	}
	o.Addr = net.JoinHostPort(*host, strconv.Itoa(*port))
	o.DisablePrefixCaching = *noPrefix
	for _, m := range strings.Split(*lora, ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(m), "="); name != "" {
			o.LoRAAdapters = append(o.LoRAAdapters, name)
		}
	}
	return opts, verbosity, nil
}
