// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"bytes"
	"net"
	"slices"
	"sync"
	"time"
)

// scrapeClocks time the /metrics requests tenant B's servers receive, per
// connection: the picker keeps a connection per replica and server, so a
// connection's last scrape is when one replica last refreshed that
// server's metrics, and its age is how old that replica's view is.
type scrapeClocks struct {
	mu    sync.Mutex
	conns map[*clockedConn]struct{}
	// closedScrapes counts the scrapes of connections since closed.
	closedScrapes int
}

func newScrapeClocks() *scrapeClocks { return &scrapeClocks{conns: map[*clockedConn]struct{}{}} }

func (c *scrapeClocks) listen(addr string, ln net.Listener) net.Listener {
	return &clockedListener{Listener: ln, clocks: c, server: addr}
}

// ages returns the age at now of each replica's view of each server: the
// last scrape of each of the pickerReplicas connections to the server
// scraped most recently. A replica scrapes a server on one connection at a
// time; one it left open when it opened another (its pods re-listed after
// a cut, say) is no longer its view and must not make it look older.
func (c *scrapeClocks) ages(now time.Time) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	byServer := map[string][]time.Time{}
	for cc := range c.conns {
		if !cc.last.IsZero() {
			byServer[cc.server] = append(byServer[cc.server], cc.last)
		}
	}
	var out []time.Duration
	for _, lasts := range byServer {
		slices.SortFunc(lasts, func(a, b time.Time) int { return b.Compare(a) })
		for _, t := range lasts[:min(len(lasts), pickerReplicas)] {
			out = append(out, now.Sub(t))
		}
	}
	return out
}

type clockedListener struct {
	net.Listener
	clocks *scrapeClocks
	server string
}

func (l *clockedListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &clockedConn{Conn: nc, clocks: l.clocks, server: l.server}
	l.clocks.mu.Lock()
	l.clocks.conns[cc] = struct{}{}
	l.clocks.mu.Unlock()
	return cc, nil
}

// clockedConn notes when a /metrics request arrives. A request's first
// line may be split over reads (the HTTP server reads one byte ahead
// between requests), so the last bytes of the previous read are kept.
type clockedConn struct {
	net.Conn
	clocks *scrapeClocks
	// server is the model server's address.
	server  string
	tail    []byte // the previous reads' last bytes, fewer than scrapeLine's
	last    time.Time
	scrapes int
}

var scrapeLine = []byte("GET /metrics ")

// Read errors do not end the clock: the HTTP server interrupts its
// read-ahead with a deadline and goes on; it closes a connection it ends.
func (c *clockedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	seen := append(c.tail, p[:n]...)
	if k := bytes.Count(seen, scrapeLine); k > 0 {
		c.clocks.mu.Lock()
		c.last = time.Now()
		c.scrapes += k
		c.clocks.mu.Unlock()
		seen = seen[bytes.LastIndex(seen, scrapeLine)+len(scrapeLine):]
	}
	c.tail = append(c.tail[:0], seen[max(0, len(seen)-len(scrapeLine)+1):]...)
	return n, err
}

func (c *clockedConn) Close() error {
	c.forget()
	return c.Conn.Close()
}

func (c *clockedConn) forget() {
	c.clocks.mu.Lock()
	defer c.clocks.mu.Unlock()
	if _, ok := c.clocks.conns[c]; ok {
		delete(c.clocks.conns, c)
		c.clocks.closedScrapes += c.scrapes
	}
}
