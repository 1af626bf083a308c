// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// rawServer answers each request on a loopback socket with the next of its
// canned responses, and closes a connection after each when closeAfter.
type rawServer struct {
	ln       net.Listener
	accepted atomic.Int64
}

func startRawServer(t *testing.T, closeAfter bool, responses ...string) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &rawServer{ln: ln}
	done := make(chan struct{})
	var next atomic.Int64
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rs.accepted.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := http.ReadRequest(r); err != nil {
						return
					}
					i := int(next.Add(1)-1) % len(responses)
					if _, err := c.Write([]byte(responses[i])); err != nil || closeAfter {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return rs
}

func (rs *rawServer) target(t *testing.T, m *Manager) *server {
	t.Helper()
	host, port, _ := net.SplitHostPort(rs.ln.Addr().String())
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	ep := &datastore.Endpoint{IP: host, Port: int32(p), Address: rs.ln.Addr().String()}
	s := newServer(&m.opts, buildTarget(&m.opts, nil, ep))
	t.Cleanup(func() { m.dropConn(s) })
	return s
}

// The scrape's own HTTP/1.1 reader: framings, and answers it must refuse
// with the reason the error counter gets.
func TestClientResponses(t *testing.T) {
	page := string(mustPage(t, vllmpage.State{Waiting: 4, Running: 1, KVCacheUsage: 0.25}, vllmpage.Options{}))
	chunk := func(parts ...string) string {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(strings.ToUpper(strconv.FormatInt(int64(len(p)), 16)) + "\r\n" + p + "\r\n")
		}
		return b.String() + "0\r\n\r\n"
	}
	half := len(page) / 2
	tests := []struct {
		name       string
		response   string
		closeAfter bool
		reason     string // empty: a page with Waiting 4
		wantText   string
	}{
		{name: "content length", response: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(page)) + "\r\n\r\n" + page},
		{name: "chunked", response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(page[:half], page[half:half+7], page[half+7:])},
		{name: "chunked with extension and trailer", response: "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(page)), 16) + ";x=y\r\n" + page + "\r\n0\r\nX-Trailer: 1\r\n\r\n"},
		{name: "until close", response: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + page, closeAfter: true},
		{name: "HTTP/1.0", response: "HTTP/1.0 200 OK\r\n\r\n" + page, closeAfter: true},
		{name: "status", response: "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", reason: "status", wantText: "HTTP 503 Service Unavailable"},
		{name: "redirect", response: "HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n", reason: "status", wantText: "HTTP 302"},
		{name: "not HTTP", response: "SSH-2.0-OpenSSH\r\n\r\n", reason: "transport", wantText: "not an HTTP/1.x response"},
		{name: "bad length", response: "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", reason: "transport", wantText: "bad Content-Length"},
		{name: "unknown encoding", response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", reason: "transport", wantText: `unsupported Transfer-Encoding "gzip"`},
		{name: "bad chunk size", response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", reason: "body", wantText: `bad chunk size "zz"`},
		{name: "chunk without CRLF", response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n", reason: "body", wantText: "not followed by CRLF"},
		{name: "truncated", response: "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(page)) + "\r\n\r\n" + page[:half], closeAfter: true, reason: "body", wantText: "unexpected EOF"},
		{name: "too large", response: "HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", reason: "too_large", wantText: "exceeds the 65536-byte cap"},
		{name: "too large chunked", response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(page, page, page), reason: "too_large", wantText: "exceeds the 65536-byte cap"},
		{name: "too large until close", response: "HTTP/1.1 200 OK\r\n\r\n" + page + page + page, closeAfter: true, reason: "too_large", wantText: "exceeds the 65536-byte cap"},
		{name: "huge header", response: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", fetch.MaxHeaderBytes+1) + "\r\n\r\n", reason: "transport", wantText: "response header exceeds"},
		{name: "closed at once", response: "", closeAfter: true, reason: "transport", wantText: "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := startRawServer(t, tt.closeAfter, tt.response)
			m, err := NewManager(Options{MaxBodyBytes: 64 << 10, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s := rs.target(t, m)
			tp := startPoller(t, m)
			for i := range 2 {
				met, err := tp.fetch(s)
				if tt.reason == "" {
					if err != nil {
						t.Fatalf("scrape %d: %v", i, err)
					}
					if met.WaitingRequests != 4 || met.KVCacheUsage != 0.25 {
						t.Fatalf("scrape %d: got %+v", i, met)
					}
					continue
				}
				var se *scrapeError
				if !errors.As(err, &se) || se.Reason != tt.reason || !strings.Contains(err.Error(), tt.wantText) {
					t.Fatalf("scrape %d: error %v, want reason %s with %q", i, err, tt.reason, tt.wantText)
				}
				if s.conn.Connected() {
					t.Fatal("a failed scrape kept its connection")
				}
			}
			want := int64(1)
			if tt.closeAfter || tt.reason != "" {
				want = 2
			}
			if got := rs.accepted.Load(); got != want {
				t.Errorf("%d connections for two scrapes, want %d", got, want)
			}
		})
	}
}

// A kept connection the server closed while idle is found out by the next
// scrape, which dials again and succeeds, as does one that hangs until the
// timeout on a kept connection.
func TestClientKeptConnectionClosed(t *testing.T) {
	page := string(mustPage(t, vllmpage.State{Waiting: 4}, vllmpage.Options{}))
	// The server answers once per connection, then closes it without
	// saying so (as an idle timeout does).
	rs := startRawServer(t, true, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(page))+"\r\n\r\n"+page)
	m, err := NewManager(Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := rs.target(t, m)
	tp := startPoller(t, m)
	for i := range 3 {
		if _, err := tp.fetch(s); err != nil {
			t.Fatalf("scrape %d: %v", i, err)
		}
	}
	if got := rs.accepted.Load(); got != 3 {
		t.Errorf("%d connections for three scrapes, want 3", got)
	}
}

// A cancelled scrape (its server left) ends at once, not at its timeout.
func TestClientCancelled(t *testing.T) {
	ms := startModelServers(t, 1)[0]
	arrived := ms.block()
	m, err := NewManager(Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ep := &datastore.Endpoint{IP: ms.ip, Port: int32(ms.port), Address: ms.addr}
	s := newServer(&m.opts, buildTarget(&m.opts, nil, ep))
	t.Cleanup(func() { m.dropConn(s) })
	tp := startPoller(t, m)
	ended := tp.start(s)
	<-arrived
	tp.p.Cancel(s.conn)
	if r := <-ended; !r.cancelled {
		t.Fatalf("a cancelled scrape ended with %+v", r)
	}
	if s.conn.Connected() {
		t.Error("a cancelled scrape kept its connection")
	}
}

// Idle servers keep no more than MaxIdleConns connections between them
// (the process's file descriptors are finite); the others dial again.
func TestIdleConnectionsBounded(t *testing.T) {
	servers := startModelServers(t, 3)
	for _, s := range servers {
		s.servePage(t, vllmpage.State{Waiting: 1}, vllmpage.Options{})
	}
	h := newHarness(t, Options{RefreshInterval: 10 * time.Millisecond, IdleRefreshInterval: time.Hour, MaxIdleConns: 1})
	h.addPool("pool", nil, servers[0].port, servers...)
	seen := map[string]bool{}
	h.await(t, "a good scrape of each server", func(ev scrapeEvent) bool {
		seen[ev.address] = seen[ev.address] || ev.err == nil
		return len(seen) == len(servers)
	})
	// A scrape's connection is given up when the scrape ends, just after
	// its result is published.
	poll.Until(t, 10*time.Second, "one connection kept", func() bool { return h.m.kept.Load() == 1 })
	// And no more are dialled for idle servers meanwhile.
	if n := h.m.kept.Load(); n > 1 {
		t.Errorf("%d connections kept to idle servers, want 1", n)
	}
}

// FuzzClientResponse gives the page reader any bytes a model server could
// send: every scrape ends with a page or a scrape error, never a panic or a
// hang, and a scrape whose exchange failed never keeps its connection.
func FuzzClientResponse(f *testing.F) {
	page := string(mustPage(f, vllmpage.State{Waiting: 4, Running: 1, KVCacheUsage: 0.25}, vllmpage.Options{MinBytes: -1}))
	for _, s := range []struct {
		response   string
		closeAfter bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(page)) + "\r\n\r\n" + page, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(page)), 16) + ";x=y\r\n" + page + "\r\n0\r\nX-Trailer: 1\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + page, true},
		{"HTTP/1.0 200 OK\r\n\r\n" + page, true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n4\r\nabcd\r\n0\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n", false},
		{"HTTP/1.1 200\r\n\r\n", true},
		{"HTTP/1.1 204 No Content\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\n X: folded\r\n\r\n", true},
		{"", true},
	} {
		f.Add([]byte(s.response), s.closeAfter)
	}
	f.Fuzz(func(t *testing.T, response []byte, closeAfter bool) {
		rs := startRawServer(t, closeAfter, string(response))
		// The timeout ends a response that stops short of its length.
		m, err := NewManager(Options{MaxBodyBytes: 64 << 10, Timeout: 250 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s := rs.target(t, m)
		tp := startPoller(t, m)
		for i := range 2 {
			if _, err := tp.fetch(s); err != nil {
				var se *scrapeError
				if !errors.As(err, &se) {
					t.Fatalf("scrape %d: %v is not a scrape error", i, err)
				}
				// A page read whole that does not parse leaves the
				// connection in step; any other failure may not.
				if s.conn.Connected() && se.Reason != "parse" && se.Reason != "config" {
					t.Fatalf("scrape %d failed (%v, %s) and kept its connection", i, err, se.Reason)
				}
			}
		}
	})
}

// A scrape waiting for its server's answer, or for the rest of a page,
// holds up no other: the poller reads and parses the others meanwhile.
func TestWaitingScrapeHoldsUpNoOther(t *testing.T) {
	page := mustPage(t, vllmpage.State{Waiting: 1, Running: 2}, vllmpage.Options{})
	tests := []struct {
		name string
		// hold answers the waiting server's request in part, then holds it.
		hold func(w http.ResponseWriter)
	}{
		{"no answer yet", func(http.ResponseWriter) {}},
		{"half the page", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(page)))
			w.Write(page[:len(page)/2]) //nolint:errcheck
			w.(http.Flusher).Flush()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			servers := startModelServers(t, 2)
			slow, fast := servers[0], servers[1]
			fast.serve(http.StatusOK, page)
			arrived := make(chan struct{}, 1)
			slow.set(func(w http.ResponseWriter, r *http.Request) {
				tt.hold(w)
				arrived <- struct{}{}
				<-r.Context().Done()
			})
			m, err := NewManager(Options{CPUBudget: 1, Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			server := func(ms *modelServer) *server {
				ep := &datastore.Endpoint{IP: ms.ip, Port: int32(ms.port), Address: ms.addr}
				s := newServer(&m.opts, buildTarget(&m.opts, nil, ep))
				t.Cleanup(func() { m.dropConn(s) })
				return s
			}
			waiting, answered := server(slow), server(fast)
			tp := startPoller(t, m)
			ended := tp.start(waiting)
			<-arrived
			for i := range 3 {
				met, err := tp.fetch(answered)
				if err != nil {
					t.Fatalf("scrape %d beside a waiting one: %v", i, err)
				}
				if met.WaitingRequests != 1 || met.RunningRequests != 2 {
					t.Errorf("scrape %d beside a waiting one read %+v", i, met)
				}
			}
			select {
			case r := <-ended:
				t.Fatalf("the waiting scrape ended with %+v", r)
			default:
			}
			tp.p.Cancel(waiting.conn)
			if r := <-ended; !r.cancelled {
				t.Fatalf("the cancelled scrape ended with %+v", r)
			}
		})
	}
}

// Plain http to an IP address runs on a poller; anything else goes through
// net/http.
func TestPollable(t *testing.T) {
	tests := []struct {
		url      string
		pollable bool
	}{
		{"http://10.0.0.7:8000/metrics", true},
		{"http://[fd00::7]:8000/metrics", true},
		{"http://[::ffff:10.0.0.7]:8000/metrics", true},
		{"https://10.0.0.7:8000/metrics", false},
		{"http://model-0.ns.svc:8000/metrics", false},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := pollable(target{url: tt.url, scheme: u.Scheme, host: u.Host, path: u.Path}); ok != tt.pollable {
			t.Errorf("%s: pollable %v, want %v", tt.url, ok, tt.pollable)
		}
	}
}

// Many scrapes in flight on one poller at once each end with their own
// server's page, and each server's connection is kept between rounds.
func TestPollerScrapesManyAtOnce(t *testing.T) {
	servers := startModelServers(t, 8)
	for i, ms := range servers {
		ms.servePage(t, vllmpage.State{Waiting: i}, vllmpage.Options{})
	}
	m, err := NewManager(Options{})
	if err != nil {
		t.Fatal(err)
	}
	tp := startPoller(t, m)
	var targets []*server
	for _, ms := range servers {
		ep := &datastore.Endpoint{IP: ms.ip, Port: int32(ms.port), Address: ms.addr}
		s := newServer(&m.opts, buildTarget(&m.opts, nil, ep))
		t.Cleanup(func() { m.dropConn(s) })
		targets = append(targets, s)
	}
	for round := range 3 {
		var ends []<-chan polled
		for _, s := range targets {
			ends = append(ends, tp.start(s))
		}
		for i, ch := range ends {
			r := <-ch
			if r.err != nil || r.cancelled {
				t.Fatalf("round %d, server %d: %+v", round, i, r)
			}
			if r.met.WaitingRequests != i {
				t.Errorf("round %d, server %d read waiting %d", round, i, r.met.WaitingRequests)
			}
		}
	}
	if n := m.kept.Load(); n != int64(len(servers)) {
		t.Errorf("%d connections kept for %d servers", n, len(servers))
	}
}
