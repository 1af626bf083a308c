// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/poolpicker/poolpicker/internal/modelsim"
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
	o, verbosity, err := modelsim.ParseArgs(args, stderr)
	if err != nil {
		return err
	}
	o.Logger = funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: verbosity})
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
