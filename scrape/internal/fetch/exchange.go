// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package fetch

import (
	"bytes"
	"strconv"
	"sync"
	"time"
)

// exchange is the state of a Conn's exchange in flight: the response read
// so far, and how far its framing has been followed. Each byte read is
// looked at a bounded number of times however it arrives (a byte at a
// time or all at once): whole resumes where it stopped.
type exchange struct {
	active   bool
	reused   bool // the request went on a kept connection
	written  int
	deadline time.Time
	buf      *bytes.Buffer
	eof      bool
	// read counts the bytes read from the connection.
	read int64

	// searched is the offset up to which buf was searched for the end of
	// the header (or of the framing line starting at next) without
	// finding it.
	searched int
	// bodyAt is the offset of the body once the header is whole; hdr and
	// status are the header read then.
	bodyAt int
	hdr    header
	status int
	hdrErr error
	// A chunked body's framing: next is the offset of the next unread
	// chunk-size or trailer line, after pending bytes of chunk data and
	// its CRLF; body and framing count the data and the framing followed.
	next     int
	pending  int64
	trailers bool
	body     int64
	framing  int64
	// broken is set when the response broke a bound its decoding does
	// not check (the framing's).
	broken error
	// concluded is set when the response was read whole: its connection
	// is in step for the next exchange unless the response said otherwise.
	concluded bool
	// aside is set while the aside goroutine parses the page (the
	// poller's); asideResult, asideKeep and asideRedial are what it
	// concluded.
	aside       bool
	asideResult Result
	asideKeep   bool
	asideRedial bool

	result Result

	// The epoll poller's: the exchange's sequence number, and its place
	// in the list of exchanges in flight by deadline.
	seq           uint32
	connecting    bool
	before, after *Conn
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// begin starts an exchange due by deadline.
func (x *exchange) begin(deadline time.Time) {
	x.active = true
	x.deadline = deadline
	x.result = Result{}
	x.buf = bufPool.Get().(*bytes.Buffer)
	x.buf.Reset()
}

// restart forgets what was read, to send the request again.
func (x *exchange) restart() {
	buf, deadline, seq, before, after := x.buf, x.deadline, x.seq, x.before, x.after
	*x = exchange{active: true, buf: buf, deadline: deadline, seq: seq, before: before, after: after}
	x.buf.Reset()
}

// release gives the buffer back; r is the exchange's result.
func (x *exchange) release(r Result) {
	bufPool.Put(x.buf)
	cpu, read := x.result.CPU, x.read
	*x = exchange{}
	x.result = r
	x.result.CPU += cpu
	x.result.Read = read
}

// whole reports whether buf holds the whole response, all the server
// will send, or enough to tell that it is malformed or breaks a bound:
// the decoder (decode) then reads it from buf alone and reports whatever
// is wrong with it (broken, for a bound of the framing).
func (x *exchange) whole(limit int64) bool {
	b := x.buf.Bytes()
	if x.eof {
		return true
	}
	if x.bodyAt == 0 {
		from := max(x.searched-3, 0)
		i := bytes.Index(b[from:], []byte("\r\n\r\n"))
		if i < 0 {
			x.searched = len(b)
			return len(b) > MaxHeaderBytes
		}
		i += from
		if i > MaxHeaderBytes {
			return true
		}
		x.bodyAt = i + 4
		x.status, x.hdrErr = statusOf(b)
		if x.hdrErr == nil {
			x.hdr, x.hdrErr = parseHeader(b[:x.bodyAt])
		}
		x.next, x.searched = x.bodyAt, x.bodyAt
	}
	h := x.hdr
	body := b[x.bodyAt:]
	switch {
	case x.hdrErr != nil, x.status != 200, h.length > limit:
		return true
	case h.chunked:
		return x.chunkedWhole(b, limit)
	case h.length >= 0:
		return int64(len(body)) >= h.length
	default:
		return int64(len(body)) > limit
	}
}

// chunkedWhole follows a chunked body's framing from where it stopped.
func (x *exchange) chunkedWhole(b []byte, limit int64) bool {
	for {
		if x.pending > 0 {
			if int64(len(b)-x.next) < x.pending {
				return false
			}
			x.next += int(x.pending)
			x.pending = 0
			x.searched = x.next
		}
		from := max(x.searched, x.next)
		i := bytes.Index(b[from:], []byte("\r\n"))
		if i < 0 {
			x.searched = max(len(b)-1, x.next)
			partial := int64(len(b) - x.next)
			if x.framing+partial > MaxFramingBytes {
				x.broken = Failure("too_large", "chunk framing and trailers exceed %d bytes", MaxFramingBytes)
				return true
			}
			return partial > maxLineBytes
		}
		end := from + i
		line := b[x.next:end]
		x.framing += int64(len(line)) + 2
		x.next, x.searched = end+2, end+2
		if x.framing > MaxFramingBytes {
			x.broken = Failure("too_large", "chunk framing and trailers exceed %d bytes", MaxFramingBytes)
			return true
		}
		if len(line) > maxLineBytes {
			return true
		}
		if x.trailers {
			if len(line) == 0 {
				return true
			}
			continue
		}
		if j := bytes.IndexByte(line, ';'); j >= 0 {
			line = line[:j]
		}
		size, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 62)
		if err != nil {
			return true
		}
		if size == 0 {
			x.trailers = true
			continue
		}
		x.body += int64(size)
		if x.body > limit {
			return true
		}
		x.pending = int64(size) + 2
	}
}

// conclude decodes and parses a whole response: the result, whether the
// connection stays in step for the next exchange, and whether the
// exchange is to be sent again on a new connection (a kept one the server
// had closed before answering).
func (x *exchange) conclude(c *Conn, limit int64, parse func(*Conn, []byte) error) (r Result, keep, redial bool) {
	if x.broken != nil {
		return Result{Err: Failure(ReasonOf(x.broken), "GET %s: %v", c.URL, x.broken)}, false, false
	}
	rr := responseReader{buf: x.buf, eof: x.eof}
	page, closeConn, err := decode(c.URL, &rr, limit)
	if err != nil {
		if x.reused && x.buf.Len() == 0 && x.eof {
			return Result{}, false, true
		}
		return Result{Err: err}, false, false
	}
	// A page read whole that does not parse leaves the connection in
	// step.
	return Result{Err: parse(c, page)}, !closeConn, false
}
