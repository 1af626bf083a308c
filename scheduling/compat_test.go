// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// upstream reads an upstream config kept as data in testdata/upstream: the
// Inference Extension v1.5.0 chart's default-plugins.yaml rendered with its
// default values, the llm-d router chart's (config/charts/routerlib), the
// conformance manifests' conformance-plugins.yaml, and examples from the
// Inference Extension's EndpointPickerConfig guide.
func upstream(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestUpstreamConfigs(t *testing.T) {
	cases := []struct {
		name         string
		text         string
		wantErr      string
		wantWarns    []string // substrings, one per warning, in order
		wantProfiles map[string][]string
		conformance  bool
		check        func(t *testing.T, c *Config)
	}{
		{name: "inference extension chart default", text: upstream(t, "inference-extension-chart-default.yaml"),
			wantWarns:    []string{`plugin "metrics-data-source": type metrics-data-source has nothing to do here`, `plugin "core-metrics-extractor": type core-metrics-extractor`},
			wantProfiles: map[string][]string{"default": {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}}},
		{name: "llm-d router chart default", text: upstream(t, "llm-d-router-chart-default.yaml"),
			wantWarns:    []string{"metrics-data-source", "core-metrics-extractor"},
			wantProfiles: map[string][]string{"default": {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}}},
		{name: "conformance manifests", text: upstream(t, "conformance-plugins.yaml"), conformance: true,
			wantWarns:    []string{"destination-endpoint-served-verifier has nothing to do here"},
			wantProfiles: map[string][]string{"conformance-profile": {"header-based-testing-filter"}}},
		{name: "guide: prefix scorer in tokens", text: upstream(t, "guide-prefix.yaml"),
			wantProfiles: map[string][]string{"default": {"prefix-cache-scorer", "max-score-picker"}},
			check: func(t *testing.T, c *Config) {
				// The scorer reads blockSizeTokens 5 as hashBlockSize 20 (4
				// bytes a token): 256 blocks of it are the prompt it reads.
				s, err := New(c, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if got := s.PromptBytes(); got != 256*20 {
					t.Errorf("scheduler reads %d prompt bytes, want blockSizeTokens 5 read as hashBlockSize 20 (4 bytes a token) times 256 blocks", got)
				}
			}},
		{name: "guide: feature gates, data layer, flow control", text: upstream(t, "guide-datalayer.yaml"),
			wantWarns: []string{"field dataLayer is not implemented", "field featureGates is not implemented",
				"field parser is not implemented", "field saturationDetector is not implemented", "field flowControl.maxRequests is not implemented", "metrics-data-source", "core-metrics-extractor"},
			wantProfiles: map[string][]string{"default": {"queue-scorer"}}},
		{name: "flow control section", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nflowControl:\n  enabled: true\n  queueTTL: 5s\n  noEndpointTTL: 2m\n  maxBandRequests: 10\n  maxBytes: 1000\n  flowHeader: x-tenant\nplugins:\n- type: queue-scorer\n",
			wantProfiles: map[string][]string{"default": {"queue-scorer"}},
			check: func(t *testing.T, c *Config) {
				fc := c.FlowControl
				if fc == nil || fc.Enabled == nil || !*fc.Enabled || fc.QueueTTL != "5s" || fc.NoEndpointTTL != "2m" || fc.MaxBandRequests != 10 || fc.MaxBytes != 1000 || fc.FlowHeader != "x-tenant" {
					t.Errorf("flowControl read as %+v", fc)
				}
			}},
		{name: "flow control section: bad TTL", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nflowControl:\n  queueTTL: soon\nplugins:\n- type: queue-scorer\n",
			wantErr: `flowControl: queueTTL "soon": want a non-negative duration`},
		{name: "llm-d precise, split into producers and a scorer", text: upstream(t, "llm-d-router-precise.yaml"),
			wantWarns: []string{`plugin "prefix-cache-scorer": a prefix-cache-scorer fed by precise-prefix-cache-producer "precise-prefix-cache-producer" is read as poolpicker's precise-prefix-cache-scorer`,
				`plugin "token-producer": type token-producer has nothing to do here`, `plugin "precise-prefix-cache-producer": type precise-prefix-cache-producer has nothing to do here`},
			wantProfiles: map[string][]string{"default": {"prefix-cache-scorer", "kv-cache-utilization-scorer", "queue-scorer", "max-score-picker"}},
			check: func(t *testing.T, c *Config) {
				i := slices.IndexFunc(c.Plugins, func(p PluginSpec) bool { return p.Name == "prefix-cache-scorer" })
				if i < 0 || c.Plugins[i].Type != PrecisePrefixCacheScorerType {
					t.Fatalf("plugins %+v: want prefix-cache-scorer read as %s", c.Plugins, PrecisePrefixCacheScorerType)
				}
				params := string(c.Plugins[i].Parameters)
				for _, want := range []string{`"hashSeed":"42"`, `"zmqEndpoint":"tcp://127.0.0.1:0"`, `"tokenizer":{"modelName":"Qwen/Qwen3-0.6B","url":"http://10.0.0.1:8000"}`} {
					if !strings.Contains(params, want) {
						t.Errorf("parameters %s: want %s", params, want)
					}
				}
			}},
		{name: "llm-d approximate producer named by the scorer", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: approx-prefix-cache-producer\n- type: prefix-cache-scorer\n  parameters:\n    prefixMatchInfoProducerName: approx-prefix-cache-producer\n",
			wantWarns:    []string{"approx-prefix-cache-producer has nothing to do here"},
			wantProfiles: map[string][]string{"default": {"prefix-cache-scorer"}}},
		{name: "a scorer naming no producer", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefix-cache-scorer\n  parameters:\n    prefixMatchInfoProducerName: nothing\n",
			wantErr: `prefixMatchInfoProducerName "nothing" names no precise-prefix-cache-producer`},
		{name: "llm-d payload-agnostic: a plugin poolpicker lacks", text: upstream(t, "llm-d-router-payload-agnostic.yaml"),
			wantErr: `unknown type "passthrough-parser"`},
		{name: "alias", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: active-request-scorer\n",
			wantWarns:    []string{`plugin "active-request-scorer": type active-request-scorer is read as poolpicker's in-flight-scorer`},
			wantProfiles: map[string][]string{"default": {"active-request-scorer"}},
			check: func(t *testing.T, c *Config) {
				if c.Plugins[0].Type != InFlightScorerType {
					t.Errorf("type %q", c.Plugins[0].Type)
				}
			}},
		{name: "unknown type names the known ones", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: session-affinity-scorer\n",
			wantErr: `plugins[0]: unknown type "session-affinity-scorer" (known: active-request-scorer,`},
		{name: "unknown field still refused", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nbogus: 1\nplugins:\n- type: queue-scorer\n",
			wantErr: `unknown field "bogus"`},
		{name: "other apiVersion", text: "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n",
			wantErr: `apiVersion "llm-d.ai/v1": must be "inference.networking.x-k8s.io/v1alpha1" or "llm-d.ai/v1alpha1"`},
		{name: "bad upstream parameter", text: "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefix-cache-scorer\n  parameters:\n    blockSizeTokens: many\n",
			wantErr: `plugin "prefix-cache-scorer" (type prefix-cache-scorer): parameters: blockSizeTokens`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := LoadConfig([]byte(c.text))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Warnings) != len(c.wantWarns) {
				t.Fatalf("warnings %q, want %d", cfg.Warnings, len(c.wantWarns))
			}
			for i, w := range c.wantWarns {
				if !strings.Contains(cfg.Warnings[i], w) {
					t.Errorf("warning %d %q does not say %q", i, cfg.Warnings[i], w)
				}
			}
			for _, p := range cfg.SchedulingProfiles {
				var refs []string
				for _, r := range p.Plugins {
					refs = append(refs, r.PluginRef)
				}
				if want, ok := c.wantProfiles[p.Name]; !ok || !slices.Equal(refs, want) {
					t.Errorf("profile %q plugins %q, want %q", p.Name, refs, want)
				}
			}
			if cfg.UsesConformanceTestPlugins() != c.conformance {
				t.Errorf("UsesConformanceTestPlugins %v", !c.conformance)
			}
			if c.check != nil {
				c.check(t, cfg)
			}
			// What loads must build a scheduler.
			if _, err := New(cfg, Options{EnableConformanceTestFilter: c.conformance}); err != nil {
				t.Fatalf("New: %v", err)
			}
		})
	}
}
