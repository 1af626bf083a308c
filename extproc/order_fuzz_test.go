// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// orderMessages are the building blocks of a random gateway; a fuzz input
// is a sequence of indexes into it.
var orderMessages = []func() *extprocv3.ProcessingRequest{
	func() *extprocv3.ProcessingRequest {
		return withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)
	},
	func() *extprocv3.ProcessingRequest { return reqHeaders(envoyHeaders("GET", "/v1/models"), true) },
	func() *extprocv3.ProcessingRequest {
		return withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), buffered, filterv3.ProcessingMode_STREAMED)
	},
	func() *extprocv3.ProcessingRequest { return reqHeaders(envoyHeaders("POST", "/v1/completions"), false) },
	func() *extprocv3.ProcessingRequest { return reqBody([]byte(`{"model":"m",`), false) },
	func() *extprocv3.ProcessingRequest { return reqBody([]byte(`"prompt":"x"}`), true) },
	func() *extprocv3.ProcessingRequest { return reqBody(completionBody("m", 3), true) },
	func() *extprocv3.ProcessingRequest { return reqBody(nil, true) },
	func() *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
	},
	func() *extprocv3.ProcessingRequest {
		return respHeaders([]hdr{{":status", "200", true}}, false, "127.0.1.3:8000")
	},
	func() *extprocv3.ProcessingRequest { return respHeaders([]hdr{{":status", "204", true}}, true, "") },
	func() *extprocv3.ProcessingRequest { return respBody([]byte("data: {\"usage\":{}}\n"), false) },
	func() *extprocv3.ProcessingRequest { return respBody([]byte(`{"usage":{"prompt_tokens":1}}`), true) },
	func() *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}}
	},
	func() *extprocv3.ProcessingRequest { return &extprocv3.ProcessingRequest{} },
	func() *extprocv3.ProcessingRequest {
		m := reqHeaders(envoyHeaders("POST", "/v1/completions"), false)
		m.ObservabilityMode = true
		return m
	},
}

// FuzzMessageOrder sends random message sequences over real gRPC: the
// server must answer or end the stream with a status, never panic or hang,
// and leave no in-flight count behind.
func FuzzMessageOrder(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 4, 5, 9, 11, 12}, {1, 10}, {2, 6, 9, 12, 13}, {3, 6}, {3}, {0, 8}, {0, 4, 8, 9, 13},
		{4, 0}, {9}, {0, 6, 0}, {1, 9, 9}, {0, 6, 12}, {14, 14, 1}, {15, 6, 9, 12}, {2, 7, 8, 8}, {0, 5, 5, 5},
	} {
		f.Add(seed)
	}
	fx := newPools(f, 2, 3)
	ts := startServer(f, fx.reg, leastInFlight{}, Options{Insecure: true, BodyWaitTimeout: 20 * time.Millisecond, MaxRequestBodyBytes: 64})
	f.Fuzz(func(t *testing.T, seq []byte) {
		if len(seq) > 32 {
			seq = seq[:32]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := extprocv3.NewExternalProcessorClient(ts.conn(t, authorityOf(1))).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		recvDone := make(chan error, 1)
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					recvDone <- err
					return
				}
			}
		}()
		for _, b := range seq {
			if s.Send(orderMessages[int(b)%len(orderMessages)]()) != nil {
				break // the server ended the stream
			}
		}
		_ = s.CloseSend()
		select {
		case err := <-recvDone:
			if !errors.Is(err, io.EOF) {
				if st, ok := status.FromError(err); !ok || st.Code() == codes.Unknown || st.Code() == codes.DeadlineExceeded {
					t.Fatalf("stream %v ended with %v", seq, err)
				}
			}
		case <-ctx.Done():
			t.Fatalf("server hung on %v", seq)
		}
		eventually(t, fmt.Sprintf("in-flight counts back to 0 after %v", seq), func() bool { return fx.totalInFlight() == 0 })
	})
}
