// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tenMiBBody is a completion request whose prompt makes it 10 MiB.
func tenMiBBody() []byte {
	const head, tail = `{"model":"m","prompt":"`, `"}`
	return []byte(head + strings.Repeat("a", 10<<20-len(head)-len(tail)) + tail)
}

// TestTenMiBBodyEachShape: with the default limits (16 MiB bodies), a
// 10 MiB body is routed in every stream shape, including those that carry
// it in a single gRPC message (over gRPC's own 4 MiB default).
func TestTenMiBBodyEachShape(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	body := tenMiBBody()
	const wait = 30 * time.Second

	t.Run("buffered, one message", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), buffered, buffered))
		if hr := g.recvWithin(wait); hr.GetRequestHeaders() == nil {
			t.Fatalf("headers not answered: %v", hr)
		}
		g.send(reqBody(body, true))
		br := g.recvWithin(wait)
		checkPool(t, f, destination(t, br, br.GetRequestBody().GetResponse().GetHeaderMutation()), 0)
	})

	t.Run("buffered without protocol_config, one message", func(t *testing.T) {
		g := ts.open(t, authorityOf(1), nil)
		g.send(reqHeaders(envoyHeaders("POST", "/v1/completions"), false))
		if hr := g.recvWithin(wait); hr.GetRequestHeaders() == nil {
			t.Fatalf("headers not answered: %v", hr)
		}
		g.send(reqBody(body, true))
		br := g.recvWithin(wait)
		checkPool(t, f, destination(t, br, br.GetRequestBody().GetResponse().GetHeaderMutation()), 1)
	})

	t.Run("nginx gateway fabric shim, one message", func(t *testing.T) {
		g := ts.open(t, fmt.Sprintf("%s.%s:9002", poolSvc(0), poolNS(0)), nil)
		g.send(reqHeaders([]hdr{{"content-type", "application/json", false}, {"x-epp-host", poolSvc(0) + "." + poolNS(0), false}, {"x-epp-port", "9002", false}}, false))
		g.send(reqBody(body, true))
		hr := g.recvWithin(wait)
		checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
		g.recvWithin(wait)
		g.expectEOF()
	})

	for _, chunks := range []int{1, 10} {
		t.Run(fmt.Sprintf("full duplex streamed, %d chunks", chunks), func(t *testing.T) {
			g := ts.open(t, authorityOf(1), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
			parts := splitChunks(body, chunks)
			for i, c := range parts {
				g.send(reqBody(c, i == len(parts)-1))
			}
			hr := g.recvWithin(wait)
			checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 1)
			var echoed []byte
			for range parts {
				echoed = append(echoed, g.recvWithin(wait).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
			if !bytes.Equal(echoed, body) {
				t.Fatalf("body changed: %d bytes back of %d", len(echoed), len(body))
			}
		})
	}
}

// TestRecvLimitOption: a receive limit below the body refuses the message
// with ResourceExhausted, as gRPC does; the limit is the option's.
func TestRecvLimitOption(t *testing.T) {
	f := newPools(t, 1, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxRecvMsgBytes: 1 << 20})
	g := ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), buffered, buffered))
	g.recvWithin(10 * time.Second)
	g.send(reqBody(tenMiBBody(), true))
	_, err := g.stream.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 10 MiB message under a 1 MiB limit: %v, want ResourceExhausted", err)
	}
}
