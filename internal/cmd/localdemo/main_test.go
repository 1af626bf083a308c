// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// pickerBinary is cmd/poolpicker, race-built once by TestMain: a build takes
// what it takes on a cold cache, outside the test's deadlines.
var pickerBinary string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		root, err := testenv.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		dir, err := os.MkdirTemp("", "localdemo-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if pickerBinary, err = localstack.BuildPicker(context.Background(), root, dir, "-race"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// syncBuffer is a bytes.Buffer safe for the demo's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := localstack.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// children lists the processes whose parent is this one.
func children(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) {
			out = append(out, pid)
		}
	}
	return out
}

// curlCommands extracts the guide's curl commands, joining continuation lines.
func curlCommands(guide string) []string {
	var cmds []string
	var cur strings.Builder
	for _, line := range strings.Split(guide, "\n") {
		line = strings.TrimSpace(line)
		if cur.Len() == 0 && !strings.HasPrefix(line, "curl ") {
			continue
		}
		cont := strings.HasSuffix(line, "\\")
		cur.WriteString(strings.TrimSuffix(line, "\\"))
		cur.WriteByte(' ')
		if !cont {
			cmds = append(cmds, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	return cmds
}

// The demo comes up, its printed curl commands work when pasted into a
// shell, and cancelling it (what Ctrl-C does) stops every process it
// started.
func TestDemoServesPrintedCommandsAndStopsEverything(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed: the printed commands cannot be pasted")
	}
	ports := freePorts(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{
			fmt.Sprintf("--gateway-addr=127.0.0.1:%d", ports[0]),
			fmt.Sprintf("--grpc-port=%d", ports[1]), fmt.Sprintf("--grpc-health-port=%d", ports[2]), fmt.Sprintf("--metrics-port=%d", ports[3]),
			"--first-ip=127.0.60.2",
			"--poolpicker-binary=" + pickerBinary,
		}, &out, io.Discard)
	}()
	defer func() {
		if t.Failed() {
			t.Logf("demo output:\n%s", out.String())
		}
	}()
	// The guide is printed, not signalled.
	poll.Until(t, 4*time.Minute, "the demo's guide (Press Ctrl-C)", func() bool {
		select {
		case err := <-errc:
			t.Fatalf("demo ended early: %v\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), "Press Ctrl-C")
	})
	guide := out.String()
	for _, want := range []string{"3 InferencePools", "team-a/chat", "team-a/lora", "team-b/code", "127.0.60.2", "kubeconfig"} {
		if !strings.Contains(guide, want) {
			t.Fatalf("guide lacks %q:\n%s", want, guide)
		}
	}
	cmds := curlCommands(guide)
	if len(cmds) < 7 {
		t.Fatalf("%d curl commands in the guide, want at least 7:\n%s", len(cmds), guide)
	}
	for _, c := range cmds {
		sh := exec.Command("sh", "-c", c)
		b, err := sh.CombinedOutput()
		if err != nil {
			t.Fatalf("pasting %q: %v\n%s", c, err, b)
		}
		got := string(b)
		switch {
		case strings.Contains(c, "/metrics"):
			if !strings.Contains(got, "inference_pool_ready_pods") {
				t.Fatalf("%q printed no pool metrics:\n%s", c, got)
			}
		case strings.Contains(c, `"stream":true`):
			if !strings.Contains(got, "data: [DONE]") {
				t.Fatalf("%q: stream not complete:\n%s", c, got)
			}
		default:
			if !strings.Contains(got, "HTTP/1.1 200 OK") || !strings.Contains(got, `"choices"`) {
				t.Fatalf("%q:\n%s", c, got)
			}
		}
	}
	started := children(t)
	if len(started) < 3 {
		t.Fatalf("child processes %v: want at least etcd, kube-apiserver and poolpicker", started)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("demo: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("demo did not stop within a minute of its cancellation")
	}
	if !strings.Contains(out.String(), "Stopped.") {
		t.Fatalf("no stop message:\n%s", out.String())
	}
	for _, pid := range started {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Fatalf("process %d (%s) survived the demo", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}
