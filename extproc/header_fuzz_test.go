// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
	"unicode/utf8"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fuzzedHeaders is every request header the server reads, with the
// options on that make it read them all.
var fuzzedHeaders = []string{
	":path", ":method", "content-length", hdrRequestID,
	hdrObjective, hdrObjectiveDeprecated, hdrModelRewrite, hdrModelRewriteDeprecated,
	hdrEPPHost, hdrEPPPort, hdrTraceParent, hdrTraceState, hdrPoolTag, HeaderConformanceSelection,
}

// FuzzHeaderValues sends random bytes of random length in one of the
// headers the server reads, in raw_value or value, over real gRPC to a
// server with a tracer and every header-reading option on. The stream must
// be routed or refused cleanly (an OpenAI-style error, or a gRPC status),
// every metric label must stay valid, and the server must route a plain
// request afterwards. The seeds (testdata/fuzz/FuzzHeaderValues) hold the
// bytes ff fe fd that once ended the process from a model rewrite header.
func FuzzHeaderValues(f *testing.F) {
	for i := range fuzzedHeaders {
		f.Add(uint8(i), true, []byte("\xff\xfe\xfd"))
		f.Add(uint8(i), false, []byte("a\x00\nb"))
	}
	fx := newPools(f, 2, 2)
	tp := sdktrace.NewTracerProvider()
	f.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ts := startServer(f, fx.reg, leastInFlight{}, Options{Insecure: true, TrustPoolHeader: true, EnableConformanceTestBehaviors: true,
		MaxRequestBodyBytes: 1 << 10, Tracer: tp.Tracer("fuzz")})
	f.Fuzz(func(t *testing.T, which uint8, raw bool, value []byte) {
		name := fuzzedHeaders[int(which)%len(fuzzedHeaders)]
		if !raw && !utf8.Valid(value) {
			raw = true // value is a protobuf string: the client cannot send it there
		}
		hs := envoyHeaders("POST", "/v1/completions")
		if name == ":path" || name == ":method" {
			hs = hs[2:]
		}
		hs = append(hs, hdr{name, string(value), raw})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := extprocv3.NewExternalProcessorClient(ts.conn(t, authorityOf(0))).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(withProtocol(reqHeaders(hs, false), duplex, duplex)); err != nil {
			t.Fatal(err)
		}
		_ = s.Send(reqBody(completionBody("m", 1), true)) // the server may have answered already
		resp, err := s.Recv()
		switch {
		case err != nil:
			if st, ok := status.FromError(err); errors.Is(err, io.EOF) || !ok || st.Code() == codes.Unknown || st.Code() == codes.DeadlineExceeded {
				t.Fatalf("%s=%q: stream ended with %v", name, value, err)
			}
		case resp.GetImmediateResponse() != nil:
			code, body := immediateCode(t, resp)
			if code < 400 || code > 599 {
				t.Fatalf("%s=%q: answered %d", name, value, code)
			}
			if eb := errorBodyOf(t, body); eb.Error.Code != code {
				t.Fatalf("%s=%q: body code %d, status %d", name, value, eb.Error.Code, code)
			}
		default:
			destination(t, resp, resp.GetRequestHeaders().GetResponse().GetHeaderMutation())
		}
		cancel()
		checkSeriesValid(t, ts)
		routeOnce(t, ts, fx, 1)
	})
}
