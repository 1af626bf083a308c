// Command modelsim runs one simulated OpenAI-compatible model server (vLLM-like
// API and /metrics) on a given address, for running poolpicker locally and in
// tests without GPUs. Flags are named like vLLM's where vLLM has one.
//
//	modelsim --host 127.0.0.2 --port 8000 --lora-modules sql-lora,tweet-lora --max-loras 2
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/poolpicker/poolpicker/modelsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "modelsim:", err)
		os.Exit(2)
	}
}

// run parses args, serves until ctx ends, then shuts down gracefully. When
// ready is not nil it receives the listening address.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("modelsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o modelsim.Options
	host := fs.String("host", "127.0.0.1", "IP address to listen on (use a distinct loopback IP per simulated pod: 127.0.0.2, 127.0.0.3, ...)")
	port := fs.Int("port", 8000, "port to listen on")
	fs.StringVar(&o.Model, "model", modelsim.DefaultModel, "base model name")
	lora := fs.String("lora-modules", "", "comma-separated LoRA adapter names the server can serve (name or name=path; the path is ignored)")
	fs.IntVar(&o.MaxLoRAs, "max-loras", modelsim.DefaultMaxLoRAs, "LoRA adapters loaded at once")
	fs.DurationVar(&o.LoRALoadLatency, "lora-load-latency", modelsim.DefaultLoRALoadLatency, "extra time to first token when an adapter must be loaded (negative: none)")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", modelsim.DefaultMaxNumSeqs, "requests running at once; the rest wait in FIFO order")
	fs.IntVar(&o.BlockSizeTokens, "block-size", modelsim.DefaultBlockSizeTokens, "tokens per KV-cache block")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", modelsim.DefaultNumGPUBlocks, "KV-cache blocks")
	fs.IntVar(&o.MaxModelLenTokens, "max-model-len", 0, "longest prompt+output in tokens (0: 8192 or the whole KV cache if smaller)")
	noPrefix := fs.Bool("no-enable-prefix-caching", false, "disable prefix caching")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", modelsim.DefaultMaxTokens, "output length of requests without max_tokens")
	fs.DurationVar(&o.PrefillPerToken, "prefill-time-per-token", modelsim.DefaultPrefillPerToken, "prefill time per uncached prompt token with one request running (negative: none)")
	fs.DurationVar(&o.DecodePerToken, "time-per-output-token", modelsim.DefaultDecodePerToken, "time between output tokens with one request running (negative: none)")
	fs.Float64Var(&o.LoadSlowdown, "load-slowdown", modelsim.DefaultLoadSlowdown, "fractional slowdown of each step per additional running request (negative: none)")
	fs.Float64Var(&o.Jitter, "jitter", 0, "largest random fractional variation of step times, e.g. 0.1")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of generated text, output lengths and jitter")
	fs.IntVar(&o.MetricsPageBytes, "metrics-page-bytes", modelsim.DefaultMetricsPageBytes, "least size of the /metrics page (negative: gauges and one histogram set only)")
	fs.StringVar(&o.Name, "name", "", "server name in the x-modelsim-server response header (default: the listen address)")
	verbosity := fs.Int("v", 0, "log verbosity (4: one line per request)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *port < 0 || *port > 65535 {
		return fmt.Errorf("--port %d outside 0..65535", *port)
	}
	if net.ParseIP(*host) == nil {
		return fmt.Errorf("--host %q is not an IP address", *host)
	}
	o.Addr = net.JoinHostPort(*host, strconv.Itoa(*port))
	o.DisablePrefixCaching = *noPrefix
	for _, m := range strings.Split(*lora, ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(m), "="); name != "" {
			o.LoRAAdapters = append(o.LoRAAdapters, name)
		}
	}
	o.Logger = funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})
	s, err := modelsim.New(o)
	if err != nil {
		return err
	}
	// Not ctx: its end means a graceful shutdown below, not an abrupt stop.
	if err := s.Start(context.Background()); err != nil {
		return err
	}
	o.Logger.Info("serving", "addr", s.Addr(), "model", o.Model, "adapters", o.LoRAAdapters)
	if ready != nil {
		ready <- s.Addr()
	}
	select {
	case <-ctx.Done():
	case <-s.Done():
		return nil
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(shutdownCtx)
	return nil
}
