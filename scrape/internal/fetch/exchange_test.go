// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package fetch

import (
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scanFrom is where whole's next search for a line end starts.
func (x *exchange) scanFrom() int {
	switch {
	case x.bodyAt == 0:
		return max(x.searched-3, 0)
	case x.hdr.chunked:
		return max(x.searched, x.next)
	}
	return x.buf.Len() // a length or the connection's end frames the body: nothing is searched

}

func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// FuzzExchangeBounded feeds any response, in pieces of any size, to an
// exchange as a server would send it, for time and memory as well as
// crashes: the exchange stops reading within the page cap plus the header
// and framing allowances, looks at each byte it holds a bounded number of
// times however the bytes arrive, and decoding what it read allocates in
// proportion to it.
func FuzzExchangeBounded(f *testing.F) {
	const limit = 4096
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n" + strings.Repeat("X-a: "+strings.Repeat("a", 4000)+"\r\n", 40),
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-a: b\r\n", 10000),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("e", 100)+"\r\na\r\n", 1000),
		"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + strings.Repeat("x", 3*limit),
		"HTTP/1.0 200 OK\r\n\r\nabc",
	} {
		f.Add([]byte(s), uint16(1))
		f.Add([]byte(s), uint16(4096))
	}
	f.Fuzz(func(t *testing.T, response []byte, piece uint16) {
		size := int(piece%8192) + 1
		var x exchange
		x.begin(time.Time{})
		defer x.release(Result{})
		fed, scanned, calls := 0, 0, 0
		done := false
		for fed < len(response) && !done {
			n := min(size, len(response)-fed)
			x.buf.Write(response[fed : fed+n])
			fed += n
			from := x.scanFrom()
			done = x.whole(limit)
			scanned += max(x.buf.Len()-from, 0)
			calls++
		}
		if !done {
			x.eof = true
			x.whole(limit)
		}
		if bound := limit + MaxHeaderBytes + MaxFramingBytes + maxLineBytes + size; fed > bound {
			t.Fatalf("read %d bytes before the exchange stopped, want at most %d", fed, bound)
		}
		// Each call searches from where the last stopped (less a line end's
		// few bytes): about each byte once, plus a chunk's data once more.
		if bound := 3*fed + 8*calls; scanned > bound {
			t.Fatalf("searched %d bytes for %d read in %d pieces, want at most %d", scanned, fed, calls, bound)
		}
		// The heap's count is the process's: the constant allows for the
		// fuzzing machinery's own.
		c := &Conn{URL: "http://10.0.0.1:8000/metrics"}
		before := heapAllocated()
		_, _, _ = x.conclude(c, limit, func(*Conn, []byte) error { return nil })
		if got, bound := heapAllocated()-before, uint64(4*fed+1<<20); got > bound {
			t.Fatalf("decoding %d bytes allocated %d, want at most %d", fed, got, bound)
		}
	})
}
