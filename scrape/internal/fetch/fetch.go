// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package fetch reads metrics pages over plain HTTP/1.1 from servers at IP
// addresses, each over a kept connection of its own, with every exchange
// bounded in bytes (status line, headers, chunk framing and trailers
// included) and in wall time whether or not its socket ever blocks.
//
// On Linux one goroutine runs many exchanges over an epoll set (New);
// elsewhere each exchange has a goroutine of its own (the portablefetch
// build tag chooses that on Linux too, so that its tests run there:
// `go test -tags portablefetch ./scrape/...`). What is fetched,
// when, and what a page means are the caller's: the package only moves
// bytes and frames responses.
package fetch

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
)

// Fetcher runs exchanges: Submit starts one, whose end is reported to
// Options.Complete; Run is its goroutine, until Stop.
type Fetcher interface {
	// Submit starts an exchange on c; after Stop it is reported cancelled
	// at once. A Conn has at most one exchange submitted at a time.
	Submit(c *Conn)
	// Cancel ends c's exchange, submitted or in flight, as cancelled.
	Cancel(c *Conn)
	// Run serves the exchanges until Stop, then reports every one still
	// in flight cancelled and returns.
	Run()
	// Stop ends Run.
	Stop()
}

// Options configure a Fetcher.
type Options struct {
	// MaxPageBytes caps a page (a response's body, decoded); a response
	// may carry at most MaxHeaderBytes of status line and headers and
	// MaxFramingBytes of chunk framing and trailers beyond it.
	MaxPageBytes int64
	// Timeout bounds an exchange from its start: connecting, the request,
	// reading and parsing the page.
	Timeout time.Duration
	// Kept counts the connections kept open, across fetchers.
	Kept *atomic.Int64
	// Parse reads a whole page on the fetcher's goroutine (the epoll
	// poller parses a large page on a thread of its own, so that it holds
	// no other exchange; never two pages of one Conn at once); page is
	// valid only during the call. Its error ends the exchange, leaving the
	// connection kept (the response was read whole).
	Parse func(c *Conn, page []byte) error
	// Complete hears of each exchange's end, on the fetcher's goroutine.
	Complete func(c *Conn, r Result)
}

// MaxHeaderBytes bounds a response's status line and headers.
const MaxHeaderBytes = 64 << 10

// MaxFramingBytes bounds a chunked response's chunk-size lines and
// trailers: real servers write chunks of kilobytes, a few bytes of framing
// each, and no trailers.
const MaxFramingBytes = 64 << 10

// maxLineBytes bounds one chunk-size line or trailer line.
const maxLineBytes = 4096

// Result is the end of an exchange.
type Result struct {
	// Err is an *Error, or an error of Options.Parse.
	Err       error
	Cancelled bool
	// CPU is the exchange's share of the CPU time of its fetcher's
	// goroutine (where the platform measures it; wall time otherwise).
	CPU time.Duration
	// Read is the bytes of the response read from the connection.
	Read int64
}

// Conn is one page of one server, and the connection kept to it between
// exchanges. The caller makes it once per server and closes it when the
// server goes; the fetcher alone uses its other state.
type Conn struct {
	// URL names the page in errors.
	URL  string
	addr netip.AddrPort
	// request is the GET of the page.
	request []byte
	// Owner is the caller's, untouched by the fetcher.
	Owner any

	cancelled atomic.Bool
	sys       sysConn
	x         exchange
}

// NewConn returns the connection to the page at path of the server at
// addr, named url in errors.
func NewConn(url string, addr netip.AddrPort, path, host string) *Conn {
	return &Conn{
		URL: url, addr: addr,
		request: []byte("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: poolpicker\r\nAccept: text/plain;version=0.0.4\r\n\r\n"),
		sys:     newSysConn(),
	}
}

// ClearCancel forgets a cancellation of c's last exchange, before the
// next Submit: a Cancel between the two still ends that one.
func (c *Conn) ClearCancel() { c.cancelled.Store(false) }

// Error is a failed exchange with its reason: connect, transport, status,
// body, too_large or timeout.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Failure returns an *Error with reason and a formatted message.
func Failure(reason string, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// ReasonOf returns err's reason, "transport" when it has none.
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return "transport"
}
