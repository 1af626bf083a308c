// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Option configures the command NewCommand builds.
type Option func(*Command)

// WithPlugin adds a scheduling plugin type, built by factory, to the types
// the command's scheduling config may name, as kube-scheduler's
// app.WithPlugin does. A type already known (a built-in one included) is a
// usage error when the command runs: two plugins claiming one type would
// make a config mean whichever came last.
func WithPlugin(typeName string, factory framework.Factory) Option {
	return func(c *Command) {
		if err := c.plugins.Register(typeName, factory); err != nil && c.err == nil {
			c.err = err
		}
	}
}

// Command is the poolpicker command: its flags, its components and their
// run, with the scheduling plugins its options added.
type Command struct {
	// plugins are the built-in plugins and those of WithPlugin.
	plugins *framework.Registry
	// err is the first option that failed, reported by Run.
	err error
}

// NewCommand returns the poolpicker command with the built-in scheduling
// plugins and those opts add.
func NewCommand(opts ...Option) *Command {
	c := &Command{plugins: scheduling.NewRegistry()}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Run parses args, wires the components and runs them until ctx is done.
// It returns the process exit code: 0 after a clean stop, 2 for bad flags
// or configuration (nothing was started), 1 for a failure while running.
func (c *Command) Run(ctx context.Context, args []string, stderr io.Writer) int {
	if c.err != nil {
		fmt.Fprintf(stderr, "poolpicker: scheduling plugins: %v\n", c.err)
		return exitUsage
	}
	return run(ctx, args, stderr, c.plugins)
}

// Main runs the command with the process's flags until SIGTERM or SIGINT,
// then exits with its status (see Run).
func (c *Command) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := c.Run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// Main runs poolpicker with the built-in scheduling plugins: NewCommand().Main().
func Main() { NewCommand().Main() }
