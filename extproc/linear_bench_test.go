// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Costs linear in the input: the same 16 MiB body in 1 KiB messages and in
// one, and subset hints of growing length, through the server's handler
// with the default scheduler. Per byte (per entry) the costs must stay
// flat; the ratios are on the performance page.

const linearBodyBytes = 16 << 20

// linearBodies are completion bodies of size bytes: one whose prompt is the bulk,
// and one whose bulk is a member before the prompt, which the body reader
// validates rather than skims (nothing is skimmed before the prompt).
func linearBodies(size int) map[string][]byte {
	pad := func(head, tail string) []byte {
		return []byte(head + strings.Repeat("a", size-len(head)-len(tail)) + tail)
	}
	return map[string][]byte{
		"prompt":               pad(`{"model":"m","prompt":"`, `"}`),
		"member-before-prompt": pad(`{"model":"m","user":"`, `","prompt":"hello"}`),
	}
}

func linearRequest(body []byte, piece int) []*extprocv3.ProcessingRequest {
	msgs := []*extprocv3.ProcessingRequest{{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
			{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}}}}},
	}}
	for off := 0; off < len(body); off += piece {
		end := min(off+piece, len(body))
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}})
	}
	return msgs
}

// runReplay serves msgs as one stream per iteration, on ctxs in turn, and
// checks it was routed with every message answered (refused: answered
// once, without a destination).
func runReplay(b *testing.B, srv *Server, ctxs []context.Context, msgs []*extprocv3.ProcessingRequest, refused bool) {
	errc := make(chan error)
	i := 0
	for b.Loop() {
		st := &replayStream{ctx: ctxs[i%len(ctxs)], msgs: msgs}
		go func() { errc <- srv.Process(st) }()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		if refused {
			if st.dest != "" || st.answers != 1 {
				b.Fatalf("destination %q after %d answers, want a refusal", st.dest, st.answers)
			}
		} else if st.dest == "" || st.answers != len(msgs) {
			b.Fatalf("destination %q after %d answers, want one and %d answers", st.dest, st.answers, len(msgs))
		}
		i++
	}
}

// BenchmarkLinearBody: ns/byte of a 16 MiB body in 1 KiB pieces against
// one message, and of a 4 MiB body in 1 KiB pieces (linear: the same
// ns/byte as 16 MiB).
func BenchmarkLinearBody(b *testing.B) {
	for _, size := range []int{linearBodyBytes / 4, linearBodyBytes} {
		for name, body := range linearBodies(size) {
			for _, piece := range []int{1 << 10, size} {
				if piece == size && size != linearBodyBytes {
					continue
				}
				b.Run(fmt.Sprintf("body=%s/size=%dMiB/piece=%dKiB", name, size>>20, piece>>10), func(b *testing.B) {
					srv := benchServer(b, Options{MaxRequestBodyBytes: 2 * linearBodyBytes})
					msgs := linearRequest(body, piece)
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					runReplay(b, srv, benchContexts(), msgs, false)
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(body)), "ns/byte")
				})
			}
		}
	}
}

// BenchmarkLinearSubsetHint: ns per entry of a subset hint (metadata_context
// envoy.lb.subset_hint, a list) of growing length, the pool's endpoints
// among addresses that match none; past DefaultMaxSubsetHintEntries, the cost of
// its refusal.
func BenchmarkLinearSubsetHint(b *testing.B) {
	for _, n := range []int{100, 1_000, DefaultMaxSubsetHintEntries, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			srv := benchServer(b, Options{})
			vals := make([]*structpb.Value, 0, n)
			for j := 0; j < 8; j++ {
				vals = append(vals, structpb.NewStringValue(fmt.Sprintf("127.0.1.%d:8000", j+2))) // pool-0's endpoints
			}
			for j := len(vals); j < n; j++ {
				vals = append(vals, structpb.NewStringValue(fmt.Sprintf("10.%d.%d.%d:8000", j>>16, (j>>8)&255, j&255)))
			}
			msgs := linearRequest(completionBody("m", 64), 1<<20)
			msgs[0].MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{
				MetadataKeySubset: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
			b.ReportAllocs()
			runReplay(b, srv, benchContexts()[:1], msgs, n > DefaultMaxSubsetHintEntries) // pool-0, whose endpoints the hint lists
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/entry")
		})
	}
}
