// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"strconv"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/extproc"
)

// bindExtprocFlags binds the ext_proc server's flags to o; each flag's
// default is the Options field's (its zero value's meaning).
func bindExtprocFlags(fs *pflag.FlagSet, o *extproc.Options) {
	fs.IntVar(&o.GRPCPort, "grpc-port", extproc.DefaultGRPCPort, "Port of the ext_proc gRPC server gateways connect to.")
	fs.IntVar(&o.HealthPort, "grpc-health-port", extproc.DefaultHealthPort, "Port of the gRPC health server (liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); always plaintext.")
	secure := fs.VarPF(&invertedBool{p: &o.Insecure}, "secure-serving", "", "Serve ext_proc over TLS (ALPN h2; versions and suites: --tls-min-version, --tls-cipher-suites; client certificates: --client-ca-file).")
	secure.DefValue = "true"
	secure.NoOptDefVal = "true"
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "Directory holding tls.crt and tls.key for ext_proc TLS; empty makes a self-signed certificate at start.")
	fs.BoolVar(&o.EnableCertReload, "enable-cert-reload", o.EnableCertReload, "Reload --cert-path's files and --client-ca-file when they change.")
	fs.IntVar(&o.MaxRequestBodyBytes, "max-request-body-bytes", extproc.DefaultMaxRequestBodyBytes, "Largest request body held for parsing; larger bodies are answered 413.")
	fs.IntVar(&o.MaxConcurrentStreams, "max-concurrent-streams", extproc.DefaultMaxConcurrentStreams, "Most ext_proc streams open at once, over all connections and pools; a stream beyond it is refused with RESOURCE_EXHAUSTED. Once its headers name its pool, a stream counts against the pool's fair share (--fair-share-reserve-percent); past it the request is answered 429. Negative: no limit.")
	fs.Int64Var(&o.MaxHeldRequestBodyBytes, "max-held-request-body-bytes", extproc.DefaultMaxHeldRequestBodyBytes, "Budget of request-body bytes all streams hold until their decision or until they wait in the flow-control queue, shared fairly between namespaces and pools (--fair-share-reserve-percent); a body counts once, each of its messages 256 bytes more. A stream whose pool's share cannot take its next chunk is answered 503. Negative: no budget.")
	fs.IntVar(&o.FairShareReservePercent, "fair-share-reserve-percent", 10, "Percent of each process-wide limit (--max-concurrent-streams, --max-held-request-body-bytes, --flow-control-max-queued-bytes, --metrics-max-concurrent-scrapes, --prefix-index-max-bytes, --max-model-labels) kept for the pools and namespaces holding none of it yet; the rest is guaranteed in equal shares to the namespaces holding some, and within a namespace to its pools, which may borrow what others leave idle. Negative: no reserve.")
	fs.IntVar(&o.MaxSubsetHintEntries, "max-subset-hint-entries", extproc.DefaultMaxSubsetHintEntries, "Longest subset hint (metadata_context envoy.lb.subset_hint) taken; a longer one is answered 400.")
	fs.IntVar(&o.MaxModelLabels, "max-model-labels", extproc.DefaultMaxModelLabels, "Distinct model names all namespaces' requests use as metric label values, besides those their pools' InferenceModelRewrites name (always kept), shared fairly between namespaces: a namespace may borrow names others leave idle and gives them back (their series deleted) to a namespace within its share; its names past its share are counted as \"other\".")
	fs.DurationVar(&o.RequestBodyStartTimeout, "request-body-start-timeout", extproc.DefaultRequestBodyStartTimeout, "Longest wait from a stream's start to its first request body message, when the request has a body; then 408. Negative: no deadline.")
	fs.DurationVar(&o.RequestBodyTimeout, "request-body-timeout", extproc.DefaultRequestBodyTimeout, "Longest time from a request body's first message to its end; then 408. Negative: no deadline.")
	fs.DurationVar(&o.ResponseIdleTimeout, "response-idle-timeout", extproc.DefaultResponseIdleTimeout, "Longest silence between messages of a stream once the request is forwarded; then the stream ends with DEADLINE_EXCEEDED. Negative: no deadline.")
	fs.BoolVar(&o.TrustPoolHeader, "trust-pool-header", o.TrustPoolHeader, "Let the request header x-gateway-inference-pool name the pool. Only when the gateway sets it and strips client copies: clients can forge headers.")
	fs.BoolVar(&o.EnableConformanceTestBehaviors, "enable-conformance-test-behaviors", o.EnableConformanceTestBehaviors, "Honour the conformance suite's test-epp-endpoint-selection header and echo the served endpoint. Never in production.")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", extproc.DefaultDrainTimeout, "How long to let open streams finish on shutdown before cutting them.")
}

// invertedBool is a bool flag stored negated: the flag says
// --secure-serving, the Options field says Insecure so its zero value is the
// secure default.
type invertedBool struct{ p *bool }

func (b *invertedBool) String() string {
	if b == nil || b.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*b.p)
}

func (b *invertedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.p = !v
	return nil
}

func (b *invertedBool) Type() string { return "bool" }
