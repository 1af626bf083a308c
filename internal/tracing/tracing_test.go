// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tracing

import (
	"context"
	"strings"
	"testing"
)

// TestNew covers the choices made from the environment; the spans of a
// configured provider are tested through the ext_proc server in
// extproc/tracing_test.go, against a real OTLP receiver.
func TestNew(t *testing.T) {
	cases := []struct {
		name         string
		env          map[string]string
		wantExporter string // "": no provider
		wantSampler  string
		wantWarn     string
		wantErr      string
	}{
		{name: "nothing configured: no provider, a warning", env: nil, wantWarn: "no exporter is configured"},
		{name: "none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}},
		{name: "an endpoint alone means otlp, upstream's sampler", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
			wantExporter: "otlp", wantSampler: "parentbased_traceidratio(0.1)"},
		{name: "otlp at the default address", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"},
			wantExporter: "otlp", wantSampler: "always_on"},
		{name: "console", env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
			wantExporter: "console", wantSampler: "traceidratio(0.5)"},
		{name: "bad ratio falls back with a warning", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "2"},
			wantExporter: "otlp", wantSampler: "parentbased_traceidratio(0.1)", wantWarn: "OTEL_TRACES_SAMPLER_ARG=\"2\" is not a ratio"},
		{name: "unknown sampler falls back with a warning", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
			wantExporter: "otlp", wantSampler: "parentbased_traceidratio(0.1)", wantWarn: "\"jaeger_remote\" is not supported"},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "want otlp, console or none"},
		{name: "http protocol", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, wantErr: "only grpc"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, warnings, err := New(context.Background(), Config{Getenv: func(k string) string { return c.env[k] }})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(warnings, "\n"); (c.wantWarn == "") != (got == "") || !strings.Contains(got, c.wantWarn) {
				t.Errorf("warnings %q, want %q", warnings, c.wantWarn)
			}
			if c.wantExporter == "" {
				if p != nil {
					t.Fatalf("provider with exporter %s, want none", p.Exporter)
				}
				return
			}
			if p == nil {
				t.Fatalf("no provider, want exporter %s", c.wantExporter)
			}
			defer func() { _ = p.Shutdown(context.Background()) }()
			if p.Exporter != c.wantExporter || p.Sampler != c.wantSampler {
				t.Errorf("exporter %s sampler %s, want %s %s", p.Exporter, p.Sampler, c.wantExporter, c.wantSampler)
			}
		})
	}
}
