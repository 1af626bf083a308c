// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/poolpicker/poolpicker/bench/internal/proc"
)

// neighbourEnv names the environment variable that makes the harness's
// binary a noisy neighbour's gateway: another tenant's traffic, sent from
// its own process over its own connection, as another gateway (on another
// machine in a cluster) sends it.
const neighbourEnv = "SCALE_NEIGHBOUR_GATEWAY"

// neighbourJob is what a neighbour's gateway sends: Poisson arrivals at
// Rate per second to one pool for Duration.
type neighbourJob struct {
	Addr       string        `json:"addr"`
	Pool       int           `json:"pool"`
	Rate       float64       `json:"rate"`
	Duration   time.Duration `json:"duration"`
	Pods       int           `json:"pods"`
	Namespaces int           `json:"namespaces"`
	Nice       int           `json:"nice"`
}

// serveNeighbour runs the job in the environment and prints how many picks
// it made, every one checked to be routed to one of the pool's pods.
func serveNeighbour(spec string) error {
	var job neighbourJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		return fmt.Errorf("neighbour job %q: %w", spec, err)
	}
	if job.Nice != 0 {
		if err := proc.Renice(os.Getpid(), job.Nice); err != nil {
			return err
		}
	}
	g, err := newGateway(job.Addr)
	if err != nil {
		return err
	}
	defer g.close()
	c := config{Pods: job.Pods, Namespaces: job.Namespaces}
	picks, err := hotTraffic(context.Background(), g, c, []int{job.Pool}, job.Rate, neighbourLoad{}, job.Duration)
	if err != nil {
		return err
	}
	fmt.Printf("PICKS %d\n", len(picks))
	return nil
}

// neighbour is a running neighbour's gateway.
type neighbour struct {
	cmd *exec.Cmd
	out *bufio.Reader
}

// startNeighbour starts a gateway process that sends pool rate requests a
// second for d, at the harness's background nice value.
func startNeighbour(ctx context.Context, addr string, c config, pool int, rate float64, d time.Duration) (*neighbour, error) {
	spec, err := json.Marshal(neighbourJob{Addr: addr, Pool: pool, Rate: rate, Duration: d, Pods: c.Pods, Namespaces: c.Namespaces, Nice: c.BackgroundNice})
	if err != nil {
		return nil, err
	}
	cmd, out, err := startRole(ctx, neighbourEnv+"="+string(spec))
	if err != nil {
		return nil, fmt.Errorf("neighbour's gateway: %w", err)
	}
	return &neighbour{cmd: cmd, out: out}, nil
}

// wait waits for the neighbour's gateway to end and returns its picks and
// the CPU seconds it used.
func (n *neighbour) wait() (int, float64, error) {
	line, readErr := n.out.ReadString('\n')
	if err := n.cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("neighbour's gateway: %w", err)
	}
	cpu := (n.cmd.ProcessState.UserTime() + n.cmd.ProcessState.SystemTime()).Seconds()
	s, ok := strings.CutPrefix(strings.TrimSpace(line), "PICKS ")
	picks, err := strconv.Atoi(s)
	if readErr != nil || !ok || err != nil {
		return 0, cpu, errors.Join(fmt.Errorf("neighbour's gateway printed %q, want its picks", line), readErr, err)
	}
	return picks, cpu, nil
}
