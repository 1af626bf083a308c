// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !portablefetch

package fetch

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/poolpicker/poolpicker/internal/poll"
)

// A poller's thread runs at a lower priority than the process's, so that
// the kernel runs a pick's threads first.
func TestPollerThreadPriority(t *testing.T) {
	var kept atomic.Int64
	p, err := newPoller(Options{MaxPageBytes: 1 << 20, Timeout: time.Second, Kept: &kept,
		Parse: func(*Conn, []byte) error { return nil }, Complete: func(*Conn, Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(p.Run)
	t.Cleanup(func() { p.Stop(); wg.Wait() })
	poll.Until(t, 10*time.Second, "the poller's thread", func() bool { return p.tid.Load() != 0 })
	nice := func(who int) int {
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, who)
		if err != nil {
			t.Fatal(err)
		}
		return 20 - prio
	}
	process, poller := nice(0), nice(int(p.tid.Load()))
	if want := min(process+pollerNice, 19); poller != want {
		t.Errorf("the poller's thread runs at nice %d, the process at %d; want %d", poller, process, want)
	}
}

// A large page is parsed on the poller's aside goroutine: however long its
// parse takes, the poller goes on scraping the other servers meanwhile,
// and the large page's exchange ends when its parse does, with the CPU
// the parse took charged to it; one cancelled meanwhile ends cancelled,
// and Stop waits for one still being parsed.
func TestLargePageParsedAside(t *testing.T) {
	large := strings.Repeat("vllm:num_requests_running{a=\"1\"} 0\n", asidePageBytes/30)
	small := "vllm:num_requests_running 0\n"
	serve := func(page string) netip.AddrPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(page)) })}
		go srv.Serve(ln) //nolint:errcheck // ends with Close
		t.Cleanup(func() { srv.Close() })
		return netip.MustParseAddrPort(ln.Addr().String())
	}
	largeAddr, smallAddr := serve(large), serve(small)

	release := make(chan struct{})
	parsing := make(chan struct{}, 1)
	results := make(chan Result, 16)
	var kept atomic.Int64
	var parseThread atomic.Int32
	p, err := newPoller(Options{MaxPageBytes: 4 << 20, Timeout: time.Minute, Kept: &kept,
		Parse: func(c *Conn, page []byte) error {
			if len(page) > asidePageBytes {
				parseThread.Store(int32(unix.Gettid()))
				parsing <- struct{}{}
				<-release
			}
			return nil
		},
		Complete: func(c *Conn, r Result) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(p.Run)
	stopped := false
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release) // a failed test's parse held
		}
		if !stopped {
			p.Stop()
			wg.Wait()
		}
	})
	poll.Until(t, 10*time.Second, "the poller's thread", func() bool { return p.tid.Load() != 0 })

	largeConn := NewConn("http://"+largeAddr.String()+"/metrics", largeAddr, "/metrics", largeAddr.String())
	smallConn := NewConn("http://"+smallAddr.String()+"/metrics", smallAddr, "/metrics", smallAddr.String())
	defer largeConn.Close()
	defer smallConn.Close()

	p.Submit(largeConn)
	<-parsing
	if got := parseThread.Load(); got == p.tid.Load() {
		t.Fatalf("the large page is parsed on the poller's thread %d", got)
	}
	// The poller serves the small server while the large page's parse is
	// held.
	for i := range 5 {
		p.Submit(smallConn)
		if r := <-results; r.Err != nil || r.Cancelled {
			t.Fatalf("small scrape %d while the large page is parsed: %+v", i, r)
		}
	}
	close(release)
	if r := <-results; r.Err != nil || r.Cancelled || r.CPU <= 0 {
		t.Fatalf("the large page's exchange ended with %+v, want success with its parse's CPU", r)
	}

	// Cancelled while parsed aside: reported cancelled once back.
	release = make(chan struct{})
	p.Submit(largeConn)
	<-parsing
	p.Cancel(largeConn)
	close(release)
	if r := <-results; !r.Cancelled {
		t.Fatalf("a large page cancelled during its parse ended with %+v, want cancelled", r)
	}

	// Stopped while parsed aside: Run returns once the parse is back.
	largeConn.ClearCancel()
	release = make(chan struct{})
	p.Submit(largeConn)
	<-parsing
	p.Stop()
	close(release)
	wg.Wait()
	stopped = true
	if r := <-results; r.Err != nil && !r.Cancelled {
		t.Fatalf("a large page parsed during Stop ended with %+v", r)
	}
}
