// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !linux || portablefetch

package fetch

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// goFetcher runs each exchange on a goroutine of its own, reading with
// the same framing and bounds as the epoll poller: the portable fetcher,
// for platforms without epoll (a developer's macOS or Windows machine).
type goFetcher struct {
	o Options

	mu       sync.Mutex
	closed   bool
	inflight map[*Conn]struct{}
	wg       sync.WaitGroup
	stopped  chan struct{}
}

// New returns the fetcher of this platform: a goroutine per exchange.
func New(o Options) (Fetcher, error) {
	return &goFetcher{o: o, inflight: map[*Conn]struct{}{}, stopped: make(chan struct{})}, nil
}

// sysConn is a Conn's kept connection; mu guards conn against Cancel.
type sysConn struct {
	mu   *sync.Mutex
	conn net.Conn
}

func newSysConn() sysConn { return sysConn{mu: new(sync.Mutex)} }

// Close closes c's kept connection, which no exchange may be using,
// reporting whether there was one.
func (c *Conn) Close() bool {
	c.sys.mu.Lock()
	defer c.sys.mu.Unlock()
	if c.sys.conn == nil {
		return false
	}
	c.sys.conn.Close()
	c.sys.conn = nil
	return true
}

// Connected reports whether c keeps a connection.
func (c *Conn) Connected() bool {
	c.sys.mu.Lock()
	defer c.sys.mu.Unlock()
	return c.sys.conn != nil
}

func (f *goFetcher) Submit(c *Conn) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.o.Complete(c, Result{Cancelled: true})
		return
	}
	f.inflight[c] = struct{}{}
	f.wg.Add(1)
	f.mu.Unlock()
	go f.exchange(c)
}

func (f *goFetcher) Cancel(c *Conn) {
	c.cancelled.Store(true)
	c.interrupt()
}

// interrupt ends the read or write of c's exchange in flight at once.
func (c *Conn) interrupt() {
	c.sys.mu.Lock()
	if c.sys.conn != nil {
		c.sys.conn.SetDeadline(time.Unix(1, 0)) //nolint:errcheck // a closed connection has ended already
	}
	c.sys.mu.Unlock()
}

func (f *goFetcher) Run() {
	<-f.stopped
	f.wg.Wait()
}

func (f *goFetcher) Stop() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	for c := range f.inflight {
		c.cancelled.Store(true)
		c.interrupt()
	}
	f.mu.Unlock()
	close(f.stopped)
}

// exchange runs c's exchange to its end.
func (f *goFetcher) exchange(c *Conn) {
	defer f.wg.Done()
	x := &c.x
	x.begin(time.Now().Add(f.o.Timeout))
	r := f.run(c)
	if r.Cancelled || c.cancelled.Load() {
		r = Result{Cancelled: true}
	}
	if (r.Err != nil || r.Cancelled) && !x.concluded {
		f.drop(c)
	}
	x.release(r)
	f.mu.Lock()
	delete(f.inflight, c)
	f.mu.Unlock()
	r = x.result
	x.result = Result{}
	f.o.Complete(c, r)
}

func (f *goFetcher) drop(c *Conn) {
	if c.Close() {
		f.o.Kept.Add(-1)
	}
}

func (f *goFetcher) run(c *Conn) Result {
	x := &c.x
	for attempt := 0; ; attempt++ {
		if c.cancelled.Load() {
			return Result{Cancelled: true}
		}
		c.sys.mu.Lock()
		conn := c.sys.conn
		c.sys.mu.Unlock()
		x.reused = conn != nil
		if conn == nil {
			d := net.Dialer{Deadline: x.deadline}
			nc, err := d.Dial("tcp", c.addr.String())
			if err != nil {
				return Result{Err: f.failure(c, err, "connect")}
			}
			c.sys.mu.Lock()
			c.sys.conn, conn = nc, nc
			c.sys.mu.Unlock()
			f.o.Kept.Add(1)
			if c.cancelled.Load() {
				return Result{Cancelled: true}
			}
		}
		conn.SetDeadline(x.deadline) //nolint:errcheck // a failed connection fails the write
		if c.cancelled.Load() {
			// Cancel's interrupt may have come before the deadline was set.
			return Result{Cancelled: true}
		}
		if _, err := conn.Write(c.request); err != nil {
			if x.reused && attempt == 0 {
				f.drop(c)
				x.restart()
				continue
			}
			return Result{Err: f.failure(c, err, "transport")}
		}
		for {
			if x.buf.Available() < 16<<10 {
				x.buf.Grow(32 << 10)
			}
			b := x.buf.AvailableBuffer()
			n, err := conn.Read(b[:cap(b)])
			x.buf.Write(b[:n])
			x.read += int64(n)
			if errors.Is(err, io.EOF) {
				x.eof = true
			} else if err != nil {
				if x.reused && attempt == 0 && x.buf.Len() == 0 && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
					f.drop(c)
					x.restart()
					break
				}
				return Result{Err: f.failure(c, err, "body")}
			}
			if !x.whole(f.o.MaxPageBytes) {
				continue
			}
			start := ThreadCPU()
			r, keep, redial := x.conclude(c, f.o.MaxPageBytes, f.o.Parse)
			r.CPU = ThreadCPU() - start
			if redial && attempt == 0 {
				f.drop(c)
				x.restart()
				break
			}
			if !keep {
				f.drop(c)
			}
			x.concluded = true
			return r
		}
	}
}

// failure names the error of c's exchange.
func (f *goFetcher) failure(c *Conn, err error, during string) error {
	if c.cancelled.Load() {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return Failure("timeout", "GET %s: timed out after %v (%d bytes read)", c.URL, f.o.Timeout, c.x.read)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Failure("connect", "GET %s: connection refused", c.URL)
	}
	if during == "connect" {
		return Failure("connect", "GET %s: connect: %v", c.URL, err)
	}
	return readFailure(c.URL, err, c.x.buf.Len())
}

// ThreadClock reports whether ThreadCPU reads a thread's CPU clock.
const ThreadClock = false

// processStart stands for the thread CPU clock this platform lacks.
var processStart = time.Now()

// ThreadCPU is the wall time since the process started: where no thread
// CPU clock can be read cheaply, a span's wall time stands for its CPU.
func ThreadCPU() time.Duration { return time.Since(processStart) }
