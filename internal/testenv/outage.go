// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package testenv

import (
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// Outage is a loopback TCP proxy in front of the API server that a test can
// freeze. Frozen, it passes no byte either way, on open connections and on
// new ones, which it accepts and holds: what a client sees of an API server
// stopped with SIGSTOP (connections open, TLS handshakes and requests
// unanswered). Resume lets everything held flow on, as SIGCONT does. The
// API server itself keeps running, so a test can change objects through
// Env.Client while the clients behind the proxy cannot see it.
type Outage struct {
	// Config reaches the API server through the proxy, with the
	// credentials of Env.Config (TLS passes through: the proxy listens on
	// the API server's own loopback address, 127.0.0.1).
	Config *rest.Config

	ln     net.Listener
	target string
	closed chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	thawed chan struct{} // closed while not frozen
	conns  map[net.Conn]struct{}
}

// OutageProxy starts an Outage in front of e's API server, closed when the
// test ends.
func (e *Env) OutageProxy(t testing.TB) *Outage {
	t.Helper()
	o, err := e.StartOutage()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return o
}

// StartOutage starts an Outage in front of e's API server, for a caller
// without a test (a TestMain); it closes it.
func (e *Env) StartOutage() (*Outage, error) {
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	thawed := make(chan struct{})
	close(thawed)
	o := &Outage{ln: ln, target: u.Host, closed: make(chan struct{}), thawed: thawed, conns: map[net.Conn]struct{}{}}
	o.Config = rest.CopyConfig(e.Config)
	o.Config.Host = (&url.URL{Scheme: u.Scheme, Host: ln.Addr().String(), Path: u.Path}).String()
	o.wg.Add(1)
	go o.accept()
	return o, nil
}

// Cut closes every connection open through the proxy, as a network blip
// or an API server restart does: every watch through it ends, and the
// clients connect again through it.
func (o *Outage) Cut() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for c := range o.conns {
		c.Close()
	}
}

// Freeze stops every byte from passing until Resume.
func (o *Outage) Freeze() {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.thawed:
		o.thawed = make(chan struct{})
	default: // already frozen
	}
}

// Resume lets what Freeze held pass, and everything after it.
func (o *Outage) Resume() {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.thawed:
	default:
		close(o.thawed)
	}
}

// Close stops the proxy and cuts every connection through it.
func (o *Outage) Close() {
	select {
	case <-o.closed:
		return
	default:
	}
	close(o.closed)
	o.ln.Close()
	o.mu.Lock()
	for c := range o.conns {
		c.Close()
	}
	o.mu.Unlock()
	o.wg.Wait()
}

func (o *Outage) accept() {
	defer o.wg.Done()
	for {
		c, err := o.ln.Accept()
		if err != nil {
			return // closed
		}
		o.wg.Add(1)
		go o.serve(c)
	}
}

// track adds c to the connections Close cuts; false once closed.
func (o *Outage) track(c net.Conn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.closed:
		return false
	default:
	}
	o.conns[c] = struct{}{}
	return true
}

func (o *Outage) untrack(c net.Conn) {
	o.mu.Lock()
	delete(o.conns, c)
	o.mu.Unlock()
	c.Close()
}

func (o *Outage) serve(client net.Conn) {
	defer o.wg.Done()
	if !o.track(client) {
		client.Close()
		return
	}
	defer o.untrack(client)
	// Dialled at once even when frozen: a stopped process's kernel still
	// completes the TCP handshake; the bytes are what is held.
	server, err := net.Dial("tcp", o.target)
	if err != nil {
		return
	}
	if !o.track(server) {
		server.Close()
		return
	}
	defer o.untrack(server)
	done := make(chan struct{}, 2)
	go func() { o.pipe(server, client); done <- struct{}{} }()
	go func() { o.pipe(client, server); done <- struct{}{} }()
	<-done
	// One side ended: end both, so that the other copy returns.
	client.Close()
	server.Close()
	<-done
}

// pipe copies src to dst, holding each piece read while frozen.
func (o *Outage) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !o.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or cut: serve ends both sides
		}
	}
}

// pass waits while frozen; false once the proxy is closed.
func (o *Outage) pass() bool {
	o.mu.Lock()
	thawed := o.thawed
	o.mu.Unlock()
	select {
	case <-thawed:
		return true
	case <-o.closed:
		return false
	}
}
