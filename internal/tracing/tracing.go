// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package tracing builds the OpenTelemetry tracer provider of poolpicker from
// the standard OTEL_* environment, with the upstream EPP's defaults.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Defaults where the environment says nothing; the sampler's are the
// upstream EPP's (one trace in ten unless the caller's traceparent decides).
const (
	DefaultServiceName  = "poolpicker"
	DefaultSampler      = "parentbased_traceidratio"
	DefaultSamplerRatio = 0.1
	// InstrumentationName names the tracer of the ext_proc server.
	InstrumentationName = "github.com/poolpicker/poolpicker/extproc"
)

// Environment variables read here. The OTLP exporter reads the rest of its
// own (OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE, _TIMEOUT, _COMPRESSION),
// and the resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	envExporter        = "OTEL_TRACES_EXPORTER"
	envSampler         = "OTEL_TRACES_SAMPLER"
	envSamplerArg      = "OTEL_TRACES_SAMPLER_ARG"
	envEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	defaultOTLPAddress = "http://localhost:4317"
)

// Provider is a configured tracer provider; Shutdown flushes the spans
// still buffered and stops the exporter.
type Provider struct {
	Tracer trace.Tracer
	// Exporter is "otlp" or "console"; Sampler describes the sampler.
	Exporter, Sampler string
	tp                *sdktrace.TracerProvider
}

// Shutdown exports what is buffered, within ctx, and stops.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }

// Config is what New needs besides the environment.
type Config struct {
	// Version is the service.version resource attribute.
	Version string
	// Getenv reads the environment. Nil: os.Getenv. The OTLP exporter
	// reads the process environment for its other variables (headers,
	// certificate, timeout, compression), the resource for its attributes.
	Getenv func(string) string
}

// New reads the environment and returns the provider, or nil when no
// exporter is configured: OTEL_TRACES_EXPORTER=none, or neither
// OTEL_TRACES_EXPORTER nor an OTLP endpoint is set (upstream would print
// spans to stdout then; poolpicker stays quiet and says so in a warning).
// Warnings are returned for settings poolpicker replaces with a default,
// as upstream does; a malformed setting it cannot fall back from is an error.
func New(ctx context.Context, cfg Config) (p *Provider, warnings []string, err error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	exporterName := strings.TrimSpace(strings.ToLower(getenv(envExporter)))
	if exporterName == "" {
		if getenv(envEndpoint) == "" && getenv(envTracesEndpoint) == "" {
			return nil, []string{"--tracing is on but no exporter is configured, so no spans are exported: set " + envExporter + "=otlp (with " + envEndpoint + ", default " + defaultOTLPAddress + ") or =console, or pass --tracing=false"}, nil
		}
		exporterName = "otlp"
	}
	sampler, samplerDesc, warnings := samplerFromEnv(getenv)

	var exp sdktrace.SpanExporter
	switch exporterName {
	case "none":
		return nil, warnings, nil
	case "console":
		exp, err = stdouttrace.New()
	case "otlp":
		for _, env := range []string{envTracesProtocol, envProtocol} {
			if v := getenv(env); v != "" && v != "grpc" {
				return nil, warnings, fmt.Errorf("%s=%q: only grpc is supported", env, v)
			}
		}
		// For gRPC both variables are the collector's URL as is; an http
		// scheme means no TLS.
		endpoint := defaultOTLPAddress
		for _, env := range []string{envEndpoint, envTracesEndpoint} {
			if v := strings.TrimSpace(getenv(env)); v != "" {
				endpoint = v
			}
		}
		// The exporter connects lazily: a collector that is not up yet
		// costs retries, not the start-up.
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	default:
		return nil, warnings, fmt.Errorf("%s=%q: want otlp, console or none", envExporter, exporterName)
	}
	if err != nil {
		return nil, warnings, fmt.Errorf("trace exporter %s: %w", exporterName, err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(attribute.String("service.name", DefaultServiceName), attribute.String("service.version", cfg.Version)),
		resource.Environment(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, warnings, fmt.Errorf("trace resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler), sdktrace.WithResource(res))
	return &Provider{
		Tracer:   tp.Tracer(InstrumentationName, trace.WithInstrumentationVersion(cfg.Version)),
		Exporter: exporterName,
		Sampler:  samplerDesc,
		tp:       tp,
	}, warnings, nil
}

// samplerFromEnv reads OTEL_TRACES_SAMPLER and its argument. Like upstream,
// an unknown sampler or unreadable ratio falls back to the default, with a
// warning.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, string, []string) {
	var warnings []string
	name := strings.TrimSpace(strings.ToLower(getenv(envSampler)))
	if name == "" {
		name = DefaultSampler
	}
	ratio := func() float64 {
		arg := strings.TrimSpace(getenv(envSamplerArg))
		if arg == "" {
			return DefaultSamplerRatio
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			warnings = append(warnings, fmt.Sprintf("%s=%q is not a ratio from 0 to 1; using %v", envSamplerArg, arg, DefaultSamplerRatio))
			return DefaultSamplerRatio
		}
		return r
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "traceidratio":
		r := ratio()
		return sdktrace.TraceIDRatioBased(r), fmt.Sprintf("%s(%v)", name, r), warnings
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), name, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "parentbased_traceidratio":
		r := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), fmt.Sprintf("%s(%v)", name, r), warnings
	}
	warnings = append(warnings, fmt.Sprintf("%s=%q is not supported (want always_on, always_off, traceidratio or their parentbased_ forms); using %s(%v)", envSampler, name, DefaultSampler, DefaultSamplerRatio))
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(DefaultSamplerRatio)), fmt.Sprintf("%s(%v)", DefaultSampler, DefaultSamplerRatio), warnings
}
