// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"
)

// echoEnv names the environment variable that makes the harness's binary a
// loopback echo server: the floor under a pick after a pause, a round trip
// between two processes that wakes both and does nothing else.
const echoEnv = "SCALE_LOOPBACK_ECHO"

// serveEcho listens on a loopback port, prints it, and writes back every
// byte each connection sends until the parent kills the process.
func serveEcho() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", l.Addr())
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			_, _ = io.Copy(conn, conn)
		}()
	}
}

// echoProbe is a connection to a running echo server process.
type echoProbe struct {
	cmd  *exec.Cmd
	conn net.Conn
	buf  [1]byte
}

// startEcho starts an echo server process at the harness's own priority,
// as the picker runs, and connects to it.
func startEcho(ctx context.Context) (*echoProbe, error) {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), echoEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("loopback echo: %w", err)
	}
	e := &echoProbe{cmd: cmd}
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if err != nil || !ok {
		e.close()
		return nil, errors.Join(fmt.Errorf("loopback echo printed %q, want its address", line), err)
	}
	var d net.Dialer
	if e.conn, err = d.DialContext(ctx, "tcp", addr); err != nil {
		e.close()
		return nil, fmt.Errorf("loopback echo: %w", err)
	}
	return e, nil
}

// roundTrip sends one byte and waits for it to come back.
func (e *echoProbe) roundTrip() (time.Duration, error) {
	t0 := time.Now()
	if _, err := e.conn.Write(e.buf[:]); err != nil {
		return 0, fmt.Errorf("loopback echo: %w", err)
	}
	if _, err := io.ReadFull(e.conn, e.buf[:]); err != nil {
		return 0, fmt.Errorf("loopback echo: %w", err)
	}
	return time.Since(t0), nil
}

// close ends the connection and the process.
func (e *echoProbe) close() {
	if e.conn != nil {
		e.conn.Close()
	}
	_ = e.cmd.Process.Kill()
	_ = e.cmd.Wait() // killed: its exit status says only that
}
