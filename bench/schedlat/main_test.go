// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"runtime"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
	"time"
)

// blockHere blocks on release: the function the waits are grouped by.
//
//go:noinline
func blockHere(release <-chan struct{}, blocked *sync.WaitGroup) {
	blocked.Done()
	<-release
}

// spin keeps a core busy for n rounds of arithmetic.
//
//go:noinline
func spin(n int) (x uint64) {
	for i := range n {
		x = x*6364136223846793005 + uint64(i)
	}
	return x
}

func TestAnalyze(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	const sleepers = 8
	release := make(chan struct{})
	var blocked, done sync.WaitGroup
	blocked.Add(sleepers)
	for range sleepers {
		done.Go(func() { blockHere(release, &blocked) })
	}
	blocked.Wait()
	// Every P busy at once for a while.
	var sink uint64
	var mu sync.Mutex
	for range runtime.GOMAXPROCS(0) {
		done.Go(func() {
			x := spin(20_000_000)
			mu.Lock()
			sink += x
			mu.Unlock()
		})
	}
	close(release)
	done.Wait()
	trace.Stop()
	_ = sink

	r, err := analyze(&buf, "schedlat.blockHere")
	if err != nil {
		t.Fatal(err)
	}
	waits := r.waits["github.com/poolpicker/poolpicker/bench/schedlat.blockHere"]
	// A goroutine still on its way into the receive when release closed
	// never blocked; at least one did.
	if len(waits) == 0 || len(waits) > sleepers {
		t.Errorf("waits in blockHere: %d, want 1 to %d (all: %v)", len(waits), sleepers, r.waits)
	}
	for k := range r.waits {
		if !strings.Contains(k, "blockHere") {
			t.Errorf("wait grouped under %q, which does not match", k)
		}
	}
	if r.procs != runtime.GOMAXPROCS(0) {
		t.Errorf("most Ps running at once: %d, want GOMAXPROCS %d", r.procs, runtime.GOMAXPROCS(0))
	}
	var busy time.Duration
	for _, d := range r.allBusy {
		busy += d
	}
	if busy <= 0 || busy > r.span {
		t.Errorf("all Ps busy for %v of a %v trace", busy, r.span)
	}
	var out bytes.Buffer
	r.print(&out)
	if !strings.Contains(out.String(), "blockHere") || !strings.Contains(out.String(), "Ps busy") {
		t.Errorf("report lacks its sections:\n%s", out.String())
	}
}

func TestAnalyzeRejectsOtherInput(t *testing.T) {
	if _, err := analyze(strings.NewReader("not a trace"), "x"); err == nil {
		t.Fatal("analyze accepted text that is no trace")
	}
}
