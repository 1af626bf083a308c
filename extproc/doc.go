// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package extproc is poolpicker's gateway-facing side: an Envoy ext_proc v3
// ExternalProcessor server that tells, per stream, which InferencePool a
// request is for, asks the scheduler for an endpoint and hands the answer back
// in the shape each gateway reads.
//
// Every stream runs in its own goroutine as an explicit state machine
// (stream.go); streams share nothing mutable except the datastore's
// snapshots and per-endpoint in-flight counters. A stream that picked an
// endpoint finishes its in-flight accounting exactly once, whether the
// response completes, the gateway fails, or the client goes away.
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
