// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package localstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Timeouts of Process.
const (
	// ReadyTimeout bounds how long Start waits for readiness.
	ReadyTimeout = 2 * time.Minute
	// StopTimeout is how long Stop lets the process drain after SIGTERM
	// before it kills it.
	StopTimeout = 20 * time.Second
)

// BuildPicker builds cmd/poolpicker into dir, with extra go build flags, and
// returns the binary's path.
func BuildPicker(ctx context.Context, root, dir string, flags ...string) (string, error) {
	out := filepath.Join(dir, "poolpicker")
	// The go command on PATH: go test and go run put their own
	// toolchain's first.
	gobin := "go"
	args := append(append([]string{"build"}, flags...), "-o", out, "./cmd/poolpicker")
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = root
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("localstack: go build ./cmd/poolpicker: %w\n%s", err, bytes.TrimSpace(msg.Bytes()))
	}
	return out, nil
}

// Process is a child process (poolpicker) whose readiness is its gRPC health
// service "readiness". It dies with its parent (Pdeathsig), so a killed demo
// leaves no orphan picker behind.
type Process struct {
	// Path and Args are the command.
	Path string
	Args []string
	// Log is the file that receives the process's stdout and stderr
	// (appended across restarts).
	Log string
	// HealthAddr is the host:port of its gRPC health server.
	HealthAddr string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	starts  int
}

// Start starts the process and returns once its health server reports
// "readiness" SERVING; if it exits or is not ready in time, Start kills it
// and returns an error with the end of its log.
func (p *Process) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return errors.New("localstack: process already running")
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.starts++
	fmt.Fprintf(logf, "==== start %d: %s %q at %s\n", p.starts, p.Path, p.Args, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		logf.Close()
		return fmt.Errorf("localstack: starting %s: %w", p.Path, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	if err := p.waitReady(ctx, done); err != nil {
		_ = p.Kill()
		return fmt.Errorf("%w\n--- end of %s ---\n%s", err, p.Log, tail(p.Log, 40))
	}
	return nil
}

func (p *Process) waitReady(ctx context.Context, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	cc, err := grpc.NewClient("passthrough:///"+p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("readiness %s", resp.GetStatus())
		}
		// Readiness has no push notification here: poll.
		select {
		case <-done:
			p.mu.Lock()
			err := p.waitErr
			p.mu.Unlock()
			return fmt.Errorf("localstack: %s exited before it was ready: %s", filepath.Base(p.Path), waitStatus(err))
		case <-ctx.Done():
			return fmt.Errorf("localstack: %s not ready on %s within %s: %w", filepath.Base(p.Path), p.HealthAddr, ReadyTimeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Running returns the process's pid while it runs; an exit (a crash
// included) says so with its wait status.
func (p *Process) Running() (pid int, err error) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return 0, errors.New("localstack: process not started")
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return 0, fmt.Errorf("localstack: %s exited: %s", filepath.Base(p.Path), waitStatus(p.waitErr))
	default:
		return cmd.Process.Pid, nil
	}
}

// Stop sends SIGTERM, waits up to StopTimeout for the process to drain and
// exit, then kills it. Stopping a stopped process does nothing.
func (p *Process) Stop() error { return p.signalAndWait(syscall.SIGTERM, StopTimeout) }

// Kill kills the process at once (SIGKILL) and waits for it.
func (p *Process) Kill() error { return p.signalAndWait(syscall.SIGKILL, 0) }

func (p *Process) signalAndWait(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	var err error
	if grace > 0 {
		select {
		case <-done:
		case <-time.After(grace):
			err = fmt.Errorf("localstack: %s did not exit within %s of %s; killed", filepath.Base(p.Path), grace, sig)
			killGroup(cmd.Process.Pid)
			<-done
		}
	} else {
		<-done
	}
	// Whatever it started in its process group goes too.
	killGroup(cmd.Process.Pid)
	p.mu.Lock()
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	return err
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func runtimeFromUnstructured(u *unstructured.Unstructured, into any) error {
	return k8sruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}

func objectMeta(n types.NamespacedName) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: n.Namespace, Name: n.Name}
}

func metav1Now() metav1.Time { return metav1.Now() }

// waitStatus says how a process ended from its Wait error (nil: it exited 0).
func waitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
