// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/poolpicker/poolpicker/flowcontrol"
)

// Defaults of Options.
const (
	DefaultGRPCPort            = 9002
	DefaultHealthPort          = 9003
	DefaultMaxRequestBodyBytes = 16 << 20
	DefaultDrainTimeout        = 30 * time.Second
	DefaultBodyWaitTimeout     = 250 * time.Millisecond
	DefaultHealthInterval      = time.Second
	DefaultMaxModelLabels      = 1024
	// DefaultMaxSubsetHintEntries is far above a pool's endpoints (pods
	// times at most 8 target ports).
	DefaultMaxSubsetHintEntries = 10_000

	DefaultMaxConcurrentStreams    = 5000
	DefaultMaxHeldRequestBodyBytes = 256 << 20
	DefaultRequestBodyStartTimeout = 30 * time.Second
	DefaultRequestBodyTimeout      = 60 * time.Second
	DefaultResponseIdleTimeout     = 10 * time.Minute
)

// recvMsgOverheadBytes is room in a gRPC message beyond its body: headers,
// trailers and the protobuf framing of a ProcessingRequest.
const recvMsgOverheadBytes = 64 << 10

// Options configures the ext_proc server. The zero value of every field means
// its documented default; flags are bound to it in cmd/poolpicker.
type Options struct {
	// GRPCPort is the ext_proc port. Zero: 9002.
	GRPCPort int
	// HealthPort is the gRPC health port. Zero: 9003. The health port is always
	// plaintext: kubelet's gRPC probes do not speak TLS.
	HealthPort int
	// BindAddress is the host both ports bind to. Empty: all interfaces.
	BindAddress string
	// GRPCListener and HealthListener, when set, are served instead of binding
	// the ports (tests, socket activation). The server closes them.
	GRPCListener   net.Listener
	HealthListener net.Listener

	// Insecure turns TLS off on the ext_proc port. Zero (false): TLS on, which
	// is what gateways expect of an EPP by default (flag --secure-serving).
	Insecure bool
	// CertPath is a directory holding tls.crt and tls.key. Empty: a self-signed
	// certificate is made at start (gateways do not verify the EPP's
	// certificate by default).
	CertPath string
	// EnableCertReload reloads CertPath's files and ClientCAFile when they
	// change, so a rotated certificate or CA is used without a restart.
	// Zero: load once.
	EnableCertReload bool
	// ClientCAFile is a PEM bundle of CA certificates. Set, the ext_proc TLS
	// listener requires every client (gateway) to present a certificate
	// that chains to one of them and refuses the handshake otherwise
	// (mutual TLS). Empty: clients are not asked for a certificate. Needs
	// TLS (Insecure false).
	ClientCAFile string
	// TLSMinVersion is the lowest TLS version the ext_proc listener
	// accepts (tls.VersionTLS10 ... tls.VersionTLS13). Zero: TLS 1.2.
	TLSMinVersion uint16
	// TLSCipherSuites are the cipher suites the ext_proc listener accepts
	// for TLS 1.2 and below (crypto/tls IDs); TLS 1.3's suites are not
	// configurable in Go. Empty: Go's default list.
	TLSCipherSuites []uint16

	// MaxRequestBodyBytes bounds the request body the server holds; larger
	// bodies are answered 413. Zero: 16 MiB.
	MaxRequestBodyBytes int
	// MaxRecvMsgBytes is the largest gRPC message the ext_proc server takes.
	// A BUFFERED gateway sends a whole body in one message, so by default it
	// follows MaxRequestBodyBytes (plus room for the message's other
	// fields); gRPC's own 4 MiB default would refuse bodies the picker
	// accepts. Zero: MaxRequestBodyBytes + 64 KiB.
	MaxRecvMsgBytes int
	// TrustPoolHeader lets a plain request header x-gateway-inference-pool name
	// the pool. Off by default because any client can send that header: only
	// an operator whose gateway sets (and strips client copies of) it should
	// turn it on; otherwise a client could route into another tenant's pool.
	TrustPoolHeader bool
	// EnableConformanceTestBehaviors honours the conformance suite's
	// test-epp-endpoint-selection header and echoes the served endpoint in
	// x-conformance-test-served-endpoint. Never for production: it lets a
	// client pick its endpoint.
	EnableConformanceTestBehaviors bool

	// MaxConcurrentStreams bounds the ext_proc streams open at once, over
	// all connections and pools; a stream beyond it is refused at once with
	// RESOURCE_EXHAUSTED (gRPC's own per-connection limit queues instead, and
	// is per connection). Once its request headers name its pool, a stream
	// counts against its pool's fair share (FairShareReservePercent); a
	// pool past its share is answered 429 for that request alone. Each open stream holds two goroutines and its
	// buffers whatever the pool, so the default is sized to stay, with the
	// held-body budget, under the chart's 1 GiB memory limit (the measured
	// cost is in site-src/operations.md). Zero: 5,000. Negative: no limit.
	MaxConcurrentStreams int
	// MaxHeldRequestBodyBytes is the process-wide budget of request-body
	// bytes held by all streams until their decision (or until they wait
	// in flow control's queue, which counts them against its own limit),
	// shared fairly between namespaces and pools (FairShareReservePercent):
	// each body counts once, and each of its messages 256 bytes more. A
	// stream whose next chunk its pool's share cannot take is answered 503
	// and lets go of what it held. Zero: 256 MiB, a quarter of the chart's
	// 1 GiB memory limit. Negative: no budget.
	MaxHeldRequestBodyBytes int64
	// FairShareReservePercent is the part of each process-wide limit
	// (MaxConcurrentStreams, MaxHeldRequestBodyBytes, MaxModelLabels) kept for pools and
	// namespaces that hold none of it yet; the rest is guaranteed in equal
	// shares to the namespaces holding some, and within a namespace to its
	// pools, each of which may borrow what the others leave idle
	// (internal/fairshare). Zero: 10. Negative: no reserve.
	FairShareReservePercent int
	// RequestBodyStartTimeout bounds the time from a stream's start to its
	// first request body message, when the request has a body: headers that
	// never come, or headers whose body never follows, are answered 408.
	// (A request without a body, a GET, ends at its headers and never waits;
	// a BUFFERED gateway's headers are answered at once, or after
	// BodyWaitTimeout, so this counts its body's wait too.) Zero: 30s.
	// Negative: no deadline.
	RequestBodyStartTimeout time.Duration
	// RequestBodyTimeout bounds the time from a body's first message to its
	// end (end_of_stream or trailers) while it is held; past it the request
	// is answered 408. It counts the whole body, not the gaps between
	// chunks, so a body trickled in cannot hold its bytes for longer.
	// Zero: 60s. Negative: no deadline.
	RequestBodyTimeout time.Duration
	// ResponseIdleTimeout bounds the silence, once the decision is sent,
	// between one message of the stream and the next (request trailers,
	// response headers, body chunks, trailers); past it the stream ends with
	// DEADLINE_EXCEEDED and its in-flight count is released. Time since the
	// last message, not since the decision: a streamed generation may run
	// for many minutes but sends chunks all along, while a non-streamed one
	// sends its response headers only once it is done, so the default is
	// generous. Zero: 10m. Negative: no deadline.
	ResponseIdleTimeout time.Duration
	// EmitEndpointScores adds to the envoy.lb dynamic metadata of each
	// decision the key x-gateway-destination-endpoint-scores: a struct of
	// every endpoint the scheduler scored ("ip:port") to its weighted
	// total (the llm-d router's --emit-endpoint-scores). Zero: not sent.
	EmitEndpointScores bool

	// DrainTimeout bounds how long Start waits, once its context is cancelled,
	// for open streams to finish before cutting them. Zero: 30s.
	DrainTimeout time.Duration
	// DrainGracePeriod is how long, once Start's context is cancelled, the
	// server keeps accepting new streams with readiness already
	// NOT_SERVING, so that gateways and Service endpoints learn of the
	// drain before the listener closes; DrainTimeout counts from its end.
	// Zero: no grace period (the listener closes at once).
	DrainGracePeriod time.Duration
	// PoolsSynced, when set, tells whether the pool controller has seen every
	// pool present at start; readiness then waits for it instead of for the
	// first pool, so a picker that serves no pool yet can still turn ready.
	// Nil: ready once at least one pool is served and all are synced.
	PoolsSynced func() bool

	// BodyWaitTimeout applies only when the gateway did not send
	// protocol_config and headers arrive without end_of_stream: if no body
	// arrives within it, the gateway is taken to be waiting for the header
	// answer (BUFFERED without send_body_without_waiting_for_header_response),
	// so the headers are answered and the decision rides on the body answer.
	// Zero: 250ms.
	BodyWaitTimeout time.Duration
	// HealthInterval is how often readiness is re-evaluated. Zero: 1s.
	HealthInterval time.Duration
	// HealthOnGRPCPort also serves the gRPC health service on the ext_proc
	// port, for gateways that health-check the picker's cluster there (the
	// upstream EPP's --health-checking). Zero: the health port only.
	HealthOnGRPCPort bool

	// Registerer receives the request metrics. Nil: metrics are kept in a
	// private registry and not exported.
	Registerer prometheus.Registerer
	// MaxModelLabels caps the distinct model names all namespaces'
	// requests use as metric label values, shared fairly between the
	// namespaces (FairShareReservePercent): a namespace may borrow names
	// others leave idle, and gives borrowed names back (their series
	// deleted) to a namespace within its guaranteed share; names past its
	// share are counted as "other". Zero: DefaultMaxModelLabels.
	MaxModelLabels int
	// MaxSubsetHintEntries is the longest subset hint (metadata_context
	// envoy.lb.subset_hint) taken; a longer one is answered 400, since each
	// entry costs the pick a set insert. Zero: 10,000.
	MaxSubsetHintEntries int
	// Logger receives structured logs keyed pool and request. Zero: discard.
	Logger logr.Logger
	// FlowControl, when set, holds each request in its pool's queue while
	// the pool is saturated (or, with a waiting room, has no endpoint) and
	// releases it by priority band and flow. Nil: no flow control; a
	// saturated pool sheds sheddable requests only.
	FlowControl *flowcontrol.Controller
	// Tracer starts one span per request (see tracing.go). Nil: no spans,
	// and the pick path does no tracing work at all.
	Tracer trace.Tracer
}

func (o *Options) setDefaults() {
	if o.GRPCPort == 0 {
		o.GRPCPort = DefaultGRPCPort
	}
	if o.HealthPort == 0 {
		o.HealthPort = DefaultHealthPort
	}
	if o.MaxRequestBodyBytes <= 0 {
		o.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if o.MaxRecvMsgBytes <= 0 {
		o.MaxRecvMsgBytes = o.MaxRequestBodyBytes + recvMsgOverheadBytes
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.BodyWaitTimeout <= 0 {
		o.BodyWaitTimeout = DefaultBodyWaitTimeout
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.MaxHeldRequestBodyBytes == 0 {
		o.MaxHeldRequestBodyBytes = DefaultMaxHeldRequestBodyBytes
	}
	if o.RequestBodyStartTimeout == 0 {
		o.RequestBodyStartTimeout = DefaultRequestBodyStartTimeout
	}
	if o.RequestBodyTimeout == 0 {
		o.RequestBodyTimeout = DefaultRequestBodyTimeout
	}
	if o.ResponseIdleTimeout == 0 {
		o.ResponseIdleTimeout = DefaultResponseIdleTimeout
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.MaxModelLabels <= 0 {
		o.MaxModelLabels = DefaultMaxModelLabels
	}
	if o.MaxSubsetHintEntries <= 0 {
		o.MaxSubsetHintEntries = DefaultMaxSubsetHintEntries
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
}
