// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import "github.com/spf13/pflag"

// observabilityOptions are how the process is seen from outside: the
// metrics port's authentication and TLS, profiles and traces. The flags
// carry upstream's names (the Inference Extension's and llm-d's EPPs), so
// a Deployment written for them keeps its meaning.
type observabilityOptions struct {
	metricsEndpointAuth bool   // metricsAuthFilter
	metricsCertDir      string // metricsTLSFrom
	metricsClientCAFile string // metricsTLSFrom
	enablePprof         bool   // metricsServer
	tracing             bool   // startTracing
}

func bindObservabilityFlags(fs *pflag.FlagSet, o *observabilityOptions) {
	fs.StringVar(&o.metricsClientCAFile, "metrics-client-ca-file", "",
		"PEM file of CA certificates: clients of the metrics port must present a certificate signed by one of them (mutual TLS). Needs --metrics-cert-dir.")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "",
		"Directory holding tls.crt and tls.key: the metrics port serves HTTPS with them (reloaded when they change), with --tls-min-version and --tls-cipher-suites. Needs --metrics-endpoint-auth or --metrics-client-ca-file. Empty: plain HTTP.")
	fs.BoolVar(&o.tracing, "tracing", true,
		"Export an OpenTelemetry span per request, configured by the standard OTEL_* environment: OTEL_TRACES_EXPORTER (otlp, console, none; unset: otlp when OTEL_EXPORTER_OTLP_ENDPOINT is set, else nothing is exported), OTEL_EXPORTER_OTLP_ENDPOINT (gRPC), OTEL_SERVICE_NAME (default poolpicker), OTEL_TRACES_SAMPLER and _ARG (default parentbased_traceidratio, 0.1).")
	// Off by default, unlike upstream's: profiles show every tenant's
	// requests in flight, and a profile costs the shared process CPU.
	fs.BoolVar(&o.enablePprof, "enable-pprof", false,
		"Serve Go's pprof profiles under /debug/pprof/ on the metrics port, behind the same authentication as /metrics (--metrics-endpoint-auth; authorized as get on the profile's path). Off by default (upstream's default is on).")
	fs.BoolVar(&o.metricsEndpointAuth, "metrics-endpoint-auth", true,
		"Require on the metrics port a bearer token (checked with a TokenReview) whose user may get the path (/metrics: a SubjectAccessReview on that non-resource URL); no token 401, no permission 403. Needs create on tokenreviews and subjectaccessreviews. False: metrics are served to anyone who reaches the port.")
}
