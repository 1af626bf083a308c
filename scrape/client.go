// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"
)

// An http scrape is one GET over the server's own keep-alive connection,
// read on the scrape's goroutine into the pooled page buffer. net/http's
// transport costs two goroutines, two 4 KiB buffers per idle connection and
// some fifty allocations per request; at tens of thousands of servers the
// idle connections alone would take a gigabyte, and with fewer of them kept
// every idle server's scrape dialled anew. A server has one scrape in
// flight at most, so its connection needs no pool and no lock. https pages
// go through net/http (Manager.client).

// maxHeaderBytes bounds a response's status line and headers.
const maxHeaderBytes = 64 << 10

// errReused is a request on a kept connection that the server had closed
// before answering: the scrape dials again once.
var errReused = errors.New("kept connection closed by the server")

// get reads s's page into buf with a GET over s's kept connection (dialling
// one when there is none) and returns the page; ctx bounds the whole
// exchange. The connection is kept when the response was read whole and
// the server allows it, closed otherwise.
func (m *Manager) get(ctx context.Context, s *server, buf *bytes.Buffer) ([]byte, error) {
	t := s.target
	if s.conn != nil {
		page, err := m.exchange(ctx, s, buf, true)
		if !errors.Is(err, errReused) {
			return page, err
		}
	}
	var d net.Dialer
	s.slot.give() // the dial waits for the server's answer
	c, err := d.DialContext(ctx, "tcp", t.host)
	if !s.slot.take() && err == nil {
		c.Close()
		err = ctx.Err()
	}
	if err != nil {
		return nil, transportFailure(t.url, err)
	}
	if sc, ok := c.(syscall.Conn); ok {
		if s.raw, err = sc.SyscallConn(); err != nil {
			c.Close()
			return nil, transportFailure(t.url, err)
		}
	}
	s.conn = c
	m.kept.Add(1)
	return m.exchange(ctx, s, buf, false)
}

// exchange sends the request on s.conn and reads the response; on any
// error the connection is closed and forgotten.
func (m *Manager) exchange(ctx context.Context, s *server, buf *bytes.Buffer, reused bool) (page []byte, err error) {
	c := s.conn
	defer func() {
		if err != nil {
			m.dropConn(s)
		}
	}()
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(d); err != nil {
			return nil, transportFailure(s.target.url, err)
		}
	}
	// A cancelled scrape (its server left, the manager stopped) ends its
	// blocked read or write at once.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) }) //nolint:errcheck // the read fails either way
	defer stop()
	_, err = c.Write(s.request)
	if err != nil {
		if reused {
			return nil, errReused
		}
		return nil, m.readFailure(ctx, s, err, 0)
	}
	r := responseReader{c: c, raw: s.raw, slot: &s.slot, buf: buf}
	buf.Reset()
	status, end, err := r.header()
	if err != nil {
		if reused && r.read == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return nil, errReused
		}
		return nil, m.readFailure(ctx, s, err, r.read)
	}

	h, err := parseHeader(buf.Bytes()[:end])
	if err != nil {
		return nil, failure("transport", "GET %s: %v", s.target.url, err)
	}
	limit := m.opts.MaxBodyBytes
	if status != 200 {
		// The connection is closed (the deferred close): draining an error
		// page of unknown length is not worth its bytes.
		err = failure("status", "GET %s: HTTP %s", s.target.url, h.status)
		return nil, err
	}
	if h.length > limit {
		return nil, failure("too_large", "GET %s: page of %d bytes exceeds the %d-byte cap", s.target.url, h.length, limit)
	}
	var body []byte
	switch {
	case h.chunked:
		body, err = r.chunked(end, limit)
	case h.length >= 0:
		body, err = r.exactly(end, int(h.length))
	default:
		h.close = true
		body, err = r.untilEOF(end, limit)
	}
	if err != nil {
		return nil, m.readFailure(ctx, s, err, r.read)
	}
	if h.close {
		m.dropConn(s)
	}
	return body, nil
}

// readFailure names an error of the exchange after n bytes were read; a
// scrapeError of the response's framing keeps its reason.
func (m *Manager) readFailure(ctx context.Context, s *server, err error, n int) error {
	var se *scrapeError
	if errors.As(err, &se) {
		return failure(se.reason, "GET %s: %v", s.target.url, se.err)
	}
	var ne net.Error
	if ctx.Err() == context.DeadlineExceeded || (errors.As(err, &ne) && ne.Timeout()) {
		return failure("timeout", "GET %s: timed out after %v (%d bytes read)", s.target.url, m.opts.Timeout, n)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if n == 0 {
		return failure("transport", "GET %s: %v", s.target.url, err)
	}
	return failure("body", "GET %s: reading the page after %d bytes: %v", s.target.url, n, err)
}

// responseReader reads a response from c into buf: the header first, then
// the body in place behind it (a chunked body is decoded in place).
type responseReader struct {
	c net.Conn
	// raw, when set, is c's descriptor: its reads are made one system
	// call at a time, holding slot only while one runs.
	raw  syscall.RawConn
	slot *cpuSlot
	buf  *bytes.Buffer
	read int // bytes read from c
}

// fill reads at least once more from c, growing buf.
func (r *responseReader) fill() error {
	if r.buf.Available() < 16<<10 {
		r.buf.Grow(32 << 10)
	}
	b := r.buf.AvailableBuffer()
	n, err := r.readInto(b[:cap(b)])
	r.buf.Write(b[:n])
	r.read += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// readInto is one Read of c. Through raw, the slot (and with it the
// scrape's CPU clock) is given up exactly while the poller waits: the wait
// for the page, while other goroutines run on the thread, is not the
// scrape's CPU.
func (r *responseReader) readInto(b []byte) (int, error) {
	if r.raw == nil {
		r.slot.give()
		n, err := r.c.Read(b)
		if !r.slot.take() && err == nil {
			err = r.slot.ctx.Err()
		}
		return n, err
	}
	var n int
	var rerr error
	err := r.raw.Read(func(fd uintptr) bool {
		if !r.slot.take() {
			// Cancelled while waiting for a slot: the scrape ends.
			n, rerr = 0, r.slot.ctx.Err()
			return true
		}
		for {
			n, rerr = syscall.Read(int(fd), b)
			if !errors.Is(rerr, syscall.EINTR) {
				break
			}
		}
		if errors.Is(rerr, syscall.EAGAIN) {
			// Not ready: the runtime's poller waits (within c's deadline)
			// and calls again; the slot is another scrape's meanwhile.
			r.slot.give()
			return false
		}
		return true
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// header reads up to the end of the header; end is the offset of the body
// in buf.
func (r *responseReader) header() (status, end int, err error) {
	for {
		b := r.buf.Bytes()
		i := bytes.Index(b, []byte("\r\n\r\n"))
		if i >= 0 && i <= maxHeaderBytes {
			end = i + 4
			break
		}
		if i > maxHeaderBytes || len(b) > maxHeaderBytes {
			return 0, 0, failure("transport", "response header exceeds %d bytes", maxHeaderBytes)
		}
		if err := r.fill(); err != nil {
			return 0, 0, err
		}
	}
	b := r.buf.Bytes()
	// "HTTP/1.1 200 OK"
	if len(b) < 12 || !bytes.HasPrefix(b, []byte("HTTP/1.")) || b[8] != ' ' {
		return 0, 0, failure("transport", "not an HTTP/1.x response: %q", b[:min(len(b), 32)])
	}
	status, err = strconv.Atoi(string(b[9:12]))
	if err != nil {
		return 0, 0, failure("transport", "bad status line %q", b[:min(len(b), 32)])
	}
	return status, end, nil
}

// exactly reads an n-byte body at off.
func (r *responseReader) exactly(off, n int) ([]byte, error) {
	for r.buf.Len()-off < n {
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
	if r.buf.Len()-off > n {
		return nil, failure("transport", "%d bytes after the body's %d", r.buf.Len()-off-n, n)
	}
	return r.buf.Bytes()[off:], nil
}

// untilEOF reads a body that ends with the connection.
func (r *responseReader) untilEOF(off int, limit int64) ([]byte, error) {
	for {
		if int64(r.buf.Len()-off) > limit {
			return nil, failure("too_large", "page exceeds the %d-byte cap", limit)
		}
		err := r.fill()
		if errors.Is(err, io.EOF) {
			return r.buf.Bytes()[off:], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// chunked decodes a chunked body at off in place: each chunk's data is
// moved down over the chunk headers before it.
func (r *responseReader) chunked(off int, limit int64) ([]byte, error) {
	out, in := off, off // body bytes end at out; undecoded bytes start at in
	for {
		// A chunk-size line.
		var line []byte
		for {
			b := r.buf.Bytes()[in:]
			if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
				line, in = b[:i], in+i+2
				break
			}
			if len(b) > 4096 {
				return nil, failure("body", "chunk header exceeds 4096 bytes")
			}
			if err := r.fill(); err != nil {
				return nil, err
			}
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		size, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 62)
		if err != nil {
			return nil, failure("body", "bad chunk size %q", line)
		}
		if size == 0 {
			// Trailers, up to an empty line.
			for {
				b := r.buf.Bytes()[in:]
				if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
					in += i + 2
					if i == 0 {
						break
					}
					continue
				}
				if len(b) > 4096 {
					return nil, failure("body", "trailer exceeds 4096 bytes")
				}
				if err := r.fill(); err != nil {
					return nil, err
				}
			}
			if in != r.buf.Len() {
				return nil, failure("transport", "%d bytes after the chunked body", r.buf.Len()-in)
			}
			return r.buf.Bytes()[off:out], nil
		}
		if int64(out-off)+int64(size) > limit {
			return nil, failure("too_large", "page exceeds the %d-byte cap", limit)
		}
		for uint64(r.buf.Len()-in) < size+2 {
			if err := r.fill(); err != nil {
				return nil, err
			}
		}
		b := r.buf.Bytes()
		if b[in+int(size)] != '\r' || b[in+int(size)+1] != '\n' {
			return nil, failure("body", "chunk of %d bytes not followed by CRLF", size)
		}
		out += copy(b[out:], b[in:in+int(size)])
		in += int(size) + 2
	}
}

// header is what a scrape needs of a response's header.
type header struct {
	status  string
	length  int64 // -1 when absent
	chunked bool
	close   bool
}

func parseHeader(b []byte) (header, error) {
	h := header{length: -1}
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	h.status = string(bytes.TrimSpace(line[9:]))
	// HTTP/1.0 closes unless told otherwise; no model server speaks it.
	h.close = line[7] == '0'
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return h, errors.New("malformed header line")
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (h.length >= 0 && n != h.length) {
				return h, errors.New("bad Content-Length")
			}
			h.length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(value, []byte("chunked")) {
				return h, errors.New("unsupported Transfer-Encoding " + strconv.Quote(string(value)))
			}
			h.chunked = true
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				h.close = true
			} else if bytes.EqualFold(value, []byte("keep-alive")) {
				h.close = false
			}
		}
	}
	if h.chunked {
		h.length = -1
	}
	return h, nil
}

// requestBytes is the GET of t's page, built once per server.
func requestBytes(path, host string) []byte {
	return []byte("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: poolpicker\r\nAccept: text/plain;version=0.0.4\r\n\r\n")
}
