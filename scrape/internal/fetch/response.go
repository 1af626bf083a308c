// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package fetch

import (
	"bytes"
	"errors"
	"io"
	"strconv"
)

// An exchange is one GET over a server's own keep-alive connection, read
// into a pooled buffer. net/http's transport costs two goroutines, two
// 4 KiB buffers per idle connection and some fifty allocations per
// request; at tens of thousands of servers the idle connections alone
// would take a gigabyte, and with fewer of them kept every idle server's
// scrape dialled anew. A server has one exchange in flight at most, so its
// connection needs no pool and no lock.

// decode reads the response in r's buffer, which holds all of it (or all
// the server sent), and returns the page, and whether the server closes
// the connection after it.
func decode(u string, r *responseReader, limit int64) (page []byte, closeConn bool, err error) {
	status, end, err := r.header()
	if err != nil {
		return nil, false, readFailure(u, err, r.buf.Len())
	}
	h, err := parseHeader(r.buf.Bytes()[:end])
	if err != nil {
		return nil, false, Failure("transport", "GET %s: %v", u, err)
	}
	if status != 200 {
		// The connection is closed: draining an error page of unknown
		// length is not worth its bytes.
		return nil, false, Failure("status", "GET %s: HTTP %s", u, h.status)
	}
	if h.length > limit {
		return nil, false, Failure("too_large", "GET %s: page of %d bytes exceeds the %d-byte cap", u, h.length, limit)
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
		return nil, false, readFailure(u, err, r.buf.Len())
	}
	return body, h.close, nil
}

// readFailure names an error of the exchange after n bytes were read; a
// scrapeError of the response's framing keeps its reason.
func readFailure(u string, err error, n int) error {
	var fe *Error
	if errors.As(err, &fe) {
		return Failure(fe.Reason, "GET %s: %v", u, fe.Err)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if n == 0 {
		return Failure("transport", "GET %s: %v", u, err)
	}
	return Failure("body", "GET %s: reading the page after %d bytes: %v", u, n, err)
}

// responseReader reads a response from buf, which a poller filled: the
// header first, then the body in place behind it (a chunked body is
// decoded in place).
type responseReader struct {
	buf *bytes.Buffer
	// eof is set when the server closed the connection after what buf
	// holds.
	eof bool
}

// fill is asked for more than buf holds: there is no more.
func (r *responseReader) fill() error {
	if r.eof {
		return io.EOF
	}
	return io.ErrUnexpectedEOF
}

// header reads up to the end of the header; end is the offset of the body
// in buf.
func (r *responseReader) header() (status, end int, err error) {
	for {
		b := r.buf.Bytes()
		i := bytes.Index(b, []byte("\r\n\r\n"))
		if i >= 0 && i <= MaxHeaderBytes {
			end = i + 4
			break
		}
		if i > MaxHeaderBytes || len(b) > MaxHeaderBytes {
			return 0, 0, Failure("transport", "response header exceeds %d bytes", MaxHeaderBytes)
		}
		if err := r.fill(); err != nil {
			return 0, 0, err
		}
	}
	status, err = statusOf(r.buf.Bytes())
	return status, end, err
}

// statusOf reads the status code of the response in b.
func statusOf(b []byte) (int, error) {
	// "HTTP/1.1 200 OK"
	if len(b) < 12 || !bytes.HasPrefix(b, []byte("HTTP/1.")) || b[8] != ' ' {
		return 0, Failure("transport", "not an HTTP/1.x response: %q", b[:min(len(b), 32)])
	}
	status, err := strconv.Atoi(string(b[9:12]))
	if err != nil {
		return 0, Failure("transport", "bad status line %q", b[:min(len(b), 32)])
	}
	return status, nil
}

// exactly reads an n-byte body at off.
func (r *responseReader) exactly(off, n int) ([]byte, error) {
	for r.buf.Len()-off < n {
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
	if r.buf.Len()-off > n {
		return nil, Failure("transport", "%d bytes after the body's %d", r.buf.Len()-off-n, n)
	}
	return r.buf.Bytes()[off:], nil
}

// untilEOF reads a body that ends with the connection.
func (r *responseReader) untilEOF(off int, limit int64) ([]byte, error) {
	for {
		if int64(r.buf.Len()-off) > limit {
			return nil, Failure("too_large", "page exceeds the %d-byte cap", limit)
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
				return nil, Failure("body", "chunk header exceeds 4096 bytes")
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
			return nil, Failure("body", "bad chunk size %q", line)
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
					return nil, Failure("body", "trailer exceeds 4096 bytes")
				}
				if err := r.fill(); err != nil {
					return nil, err
				}
			}
			if in != r.buf.Len() {
				return nil, Failure("transport", "%d bytes after the chunked body", r.buf.Len()-in)
			}
			return r.buf.Bytes()[off:out], nil
		}
		if int64(out-off)+int64(size) > limit {
			return nil, Failure("too_large", "page exceeds the %d-byte cap", limit)
		}
		for uint64(r.buf.Len()-in) < size+2 {
			if err := r.fill(); err != nil {
				return nil, err
			}
		}
		b := r.buf.Bytes()
		if b[in+int(size)] != '\r' || b[in+int(size)+1] != '\n' {
			return nil, Failure("body", "chunk of %d bytes not followed by CRLF", size)
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
