// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package devgateway is a development and test gateway that routes OpenAI
// requests to InferencePools through an endpoint picker the way an Envoy
// gateway with the ext_proc filter in FULL_DUPLEX_STREAMED mode does; it is
// not a production gateway.
//
// Routes come from Gateway API HTTPRoutes whose backendRefs name
// InferencePools (group inference.networking.k8s.io), watched on the API
// server, so a local setup is configured exactly as a cluster is. For each
// request the gateway matches a route, picks a pool by backendRef weight,
// and opens an ext_proc stream whose :authority is the pool's
// endpointPickerRef Service as kgateway sends it (SVC.NS.svc:PORT). It
// streams the request headers and body, applies the picker's header
// mutations and streamed body, and proxies to the endpoints of
// x-gateway-destination-endpoint in order, moving on when a connection
// fails. The response goes back through the stream (headers with the served
// endpoint in metadata_context envoy.lb, then the body chunk by chunk, SSE
// included) and the picker's streamed body reaches the client as it
// arrives. ImmediateResponses are answered as they are.
//
// Where it differs from Envoy, on purpose: the client's request body is read
// whole before the stream opens (bounded by Options.MaxRequestBodyBytes), so
// that a request can be replayed when the picker is unreachable — the
// gateway holds and retries such requests for Options.ExtProcRetryWindow and
// reports every outage (Stats.Outages, logs) instead of failing at once;
// endpoint fallback also covers a kept-alive connection found dead before a
// response; request trailers, most route filters (only
// RequestHeaderModifier), ReferenceGrants and TLS to clients are not
// supported; it adds x-devgateway-endpoint and x-devgateway-pool response
// headers so people can see where a request went.
package devgateway
