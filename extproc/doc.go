// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package extproc is poolpicker's gateway-facing side: an Envoy ext_proc v3
// ExternalProcessor server that tells, per stream, which InferencePool a
// request is for, has the request controller pick an endpoint and hands the
// answer back in the shape each gateway reads.
//
// The package keeps the protocol: every stream runs in its own goroutine as
// an explicit state machine (stream.go), reads the request's headers
// (headers.go) and body (body.go), sends the decision (decision.go) and
// follows the response (response.go). The request's life past its headers
// and body, admission, scheduling and in-flight accounting, is a
// requestcontrol.Request the stream owns; the stream calls it with its
// mutex (stream.mu) held, or from close once no message can be handled any
// more. The Request takes no lock of its own (flow control and the
// datastore take theirs inside its calls), so the order is stream.mu, then
// those. Streams share nothing mutable except the datastore's snapshots and
// per-endpoint in-flight counters. A stream that picked an endpoint
// finishes its in-flight accounting exactly once (Request.Finish), whether
// the response completes, the gateway fails, or the client goes away.
//
// Wire names (see site-src/protocols.md):
//   - request header and dynamic metadata envoy.lb / x-gateway-destination-endpoint:
//     "ip:port[,ip:port...]", primary first, then fallbacks;
//   - request header x-poolpicker-pool: "namespace/name" of the picked pool;
//   - explicit pool tag x-gateway-inference-pool: "namespace/name" in gRPC
//     metadata, metadata_context or attributes (and, with TrustPoolHeader, the
//     request header of that name);
//   - response side: metadata_context envoy.lb / x-gateway-destination-endpoint-served.
package extproc
