// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// ConfigAPIVersionLLMD is the apiVersion of the llm-d router's
// EndpointPickerConfig, the current upstream one; a config may carry it or
// ConfigAPIVersion, with the same meaning.
const ConfigAPIVersionLLMD = "llm-d.ai/v1alpha1"

// configAPIVersions are the apiVersions a config may carry.
var configAPIVersions = []string{ConfigAPIVersion, ConfigAPIVersionLLMD}

// DestinationEndpointServedVerifierType is the upstream conformance plugin
// that echoes the endpoint the gateway reports as served; naming it (or
// ConformanceTestFilterType) in a config turns on the conformance-test
// behaviours (Config.UsesConformanceTestPlugins).
const DestinationEndpointServedVerifierType = "destination-endpoint-served-verifier"

// unimplementedFields are upstream EndpointPickerConfig fields poolpicker
// reads past: each present one earns a warning (Config.Warnings) saying what
// poolpicker does instead.
var unimplementedFields = map[string]string{
	"featureGates":       "poolpicker has no feature gates; every feature it has is on",
	"dataLayer":          "model-server metrics are scraped by poolpicker's own scraper (--model-server-metrics-* flags, pool annotations)",
	"saturationDetector": "saturation is judged by queue depth and KV-cache use (--saturation-* flags)",
	"requestHandler":     "request bodies are parsed as OpenAI JSON by poolpicker itself",
	"parser":             "request bodies are parsed as OpenAI JSON by poolpicker itself",
}

// inertPluginTypes are upstream plugin types whose job poolpicker always does
// by itself, so declaring one changes nothing: it is accepted (parameters
// unread), dropped from the profiles that name it, and reported in
// Config.Warnings. The value says what does the job here.
var inertPluginTypes = map[string]string{
	"metrics-data-source":                 "model-server metrics are always scraped (--model-server-metrics-* flags)",
	"core-metrics-extractor":              "queue, running, KV-cache, LoRA and cache-geometry metrics are always read (the engine by the inference.networking.k8s.io/engine-type pod label, poolpicker's own, or the pool annotation)",
	"openai-parser":                       "request bodies are always parsed as OpenAI JSON",
	"utilization-detector":                "saturation is judged by --saturation-queue-depth-threshold and --saturation-kv-cache-threshold",
	"inflight-load-producer":              "requests in flight per endpoint are always counted",
	"approx-prefix-cache-producer":        "the prefix-cache index is kept by prefix-cache-scorer",
	llmdPreciseProducerType:               "the KV events are followed by the precise-prefix-cache-scorer that a prefix-cache-scorer naming it in prefixMatchInfoProducerName is read as",
	llmdTokenProducerType:                 "prompts are tokenized by precise-prefix-cache-scorer (its vllm.url and modelName are read as the scorer's tokenizer.url and tokenizer.modelName)",
	DestinationEndpointServedVerifierType: "the served endpoint is echoed in x-conformance-test-served-endpoint with conformance-test behaviours on",
}

// pluginTypeAliases maps upstream plugin type names to the poolpicker type of
// the same meaning. An alias takes the poolpicker type's parameters.
var pluginTypeAliases = map[string]string{
	// llm-d router: prefers the endpoint with the fewest requests in flight
	// from this picker, as in-flight-scorer does.
	"active-request-scorer": InFlightScorerType,
}

// inertPlugin stands for an upstream plugin whose job poolpicker does itself.
type inertPlugin struct{ name TypedName }

func (p *inertPlugin) TypedName() TypedName { return p.name }

// stripUnimplementedFields removes the upstream-only top-level fields from a
// config document, returning the rest (as JSON) and one warning per field.
func stripUnimplementedFields(data []byte) ([]byte, flowControlSection, []string, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, nil, nil, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, nil, nil, fmt.Errorf("not a mapping: %w", err)
	}
	// flowControl is read on its own: poolpicker's fields are checked, and
	// upstream's others are warned about rather than refused.
	fc := flowControlSection(doc["flowControl"])
	delete(doc, "flowControl")
	var warns []string
	for _, field := range sortedKeys(unimplementedFields) {
		if _, ok := doc[field]; ok {
			warns = append(warns, fmt.Sprintf("field %s is not implemented and is ignored: %s", field, unimplementedFields[field]))
			delete(doc, field)
		}
	}
	out, err := json.Marshal(doc)
	return out, fc, warns, err
}

// flowControlSection is the raw flowControl section of a config, if any.
type flowControlSection json.RawMessage

// read decodes the section: poolpicker's fields strictly, each other field
// named in a warning.
func (s flowControlSection) read() (*FlowControlConfig, []string, error) {
	if len(s) == 0 || string(s) == "null" {
		return nil, nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(s, &fields); err != nil {
		return nil, nil, fmt.Errorf("not a mapping: %w", err)
	}
	known := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(FlowControlConfig{})) {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		known[name] = true
	}
	var warns []string
	for _, k := range sortedKeys(fields) {
		if !known[k] {
			warns = append(warns, fmt.Sprintf("field flowControl.%s is not implemented and is ignored; poolpicker reads %s", k, strings.Join(sortedKeys(known), ", ")))
			delete(fields, k)
		}
	}
	b, _ := json.Marshal(fields)
	c := &FlowControlConfig{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, nil, err
	}
	for name, d := range map[string]string{"queueTTL": c.QueueTTL, "noEndpointTTL": c.NoEndpointTTL} {
		if d == "" {
			continue
		}
		if v, err := time.ParseDuration(d); err != nil || v < 0 {
			return nil, nil, fmt.Errorf("%s %q: want a non-negative duration such as 30s", name, d)
		}
	}
	if c.MaxBandRequests < 0 || c.MaxBandBytes < 0 || c.MaxBytes < 0 {
		return nil, nil, fmt.Errorf("maxBandRequests, maxBandBytes and maxBytes must not be negative")
	}
	return c, warns, nil
}

// Plugin types of llm-d's split precise prefix-cache configuration (the
// llm-d router's v0.10 sample epp-precise-prefix-cache-config.yaml).
const (
	llmdPreciseProducerType = "precise-prefix-cache-producer"
	llmdApproxProducerType  = "approx-prefix-cache-producer"
	llmdTokenProducerType   = "token-producer"
)

// foldPrecise reads llm-d's split precise prefix-cache configuration (a
// token-producer tokenizing prompts, a precise-prefix-cache-producer
// following the servers' KV events, and a prefix-cache-scorer scoring what
// the producer its prefixMatchInfoProducerName names matched) as the one
// precise-prefix-cache-scorer of the same meaning: that prefix-cache-scorer
// becomes one, with the producer's parameters, the token producer's
// vllm.url and modelName as its tokenizer.url and tokenizer.modelName (the
// base model renders are asked for), and its own other parameters as its
// learned index's (approximate). The producers are then inert. A
// prefix-cache-scorer naming the approximate producer keeps its own index.
func (c *Config) foldPrecise() error {
	byName := make(map[string]*PluginSpec, len(c.Plugins))
	tokenizer := map[string]string{}
	for i := range c.Plugins {
		p := &c.Plugins[i]
		byName[p.nameOr()] = p
		if p.Type != llmdTokenProducerType || len(p.Parameters) == 0 {
			continue
		}
		var tp struct {
			ModelName string `json:"modelName"`
			VLLM      *struct {
				URL string `json:"url"`
			} `json:"vllm"`
		}
		if err := json.Unmarshal(p.Parameters, &tp); err != nil {
			return fmt.Errorf("plugin %q: parameters: %w", p.nameOr(), err)
		}
		if tp.VLLM != nil && tp.VLLM.URL != "" {
			tokenizer["url"] = tp.VLLM.URL
		}
		if tp.ModelName != "" {
			tokenizer["modelName"] = tp.ModelName
		}
	}
	for i := range c.Plugins {
		p := &c.Plugins[i]
		if p.Type != PrefixCacheScorerType || len(p.Parameters) == 0 {
			continue
		}
		var params map[string]json.RawMessage
		if err := json.Unmarshal(p.Parameters, &params); err != nil {
			return fmt.Errorf("plugin %q: parameters: %w", p.nameOr(), err)
		}
		raw, ok := params["prefixMatchInfoProducerName"]
		if !ok {
			continue
		}
		delete(params, "prefixMatchInfoProducerName")
		var producerName string
		if err := json.Unmarshal(raw, &producerName); err != nil {
			return fmt.Errorf("plugin %q: prefixMatchInfoProducerName: %w", p.nameOr(), err)
		}
		producer := byName[producerName]
		switch {
		case producer != nil && producer.Type == llmdApproxProducerType:
			p.Parameters, _ = json.Marshal(params)
			continue
		case producer == nil || producer.Type != llmdPreciseProducerType:
			return fmt.Errorf("plugin %q: prefixMatchInfoProducerName %q names no %s or %s", p.nameOr(), producerName, llmdPreciseProducerType, llmdApproxProducerType)
		}
		precise := map[string]json.RawMessage{}
		if len(producer.Parameters) > 0 {
			if err := json.Unmarshal(producer.Parameters, &precise); err != nil {
				return fmt.Errorf("plugin %q: parameters: %w", producerName, err)
			}
		}
		if len(params) > 0 {
			precise["approximate"], _ = json.Marshal(params)
		}
		if _, ok := precise["tokenizer"]; !ok && len(tokenizer) > 0 {
			precise["tokenizer"], _ = json.Marshal(tokenizer)
		}
		p.Parameters, _ = json.Marshal(precise)
		p.Name = p.nameOr()
		p.Type = PrecisePrefixCacheScorerType
		c.Warnings = append(c.Warnings, fmt.Sprintf("plugin %q: a prefix-cache-scorer fed by %s %q is read as poolpicker's %s with its parameters", p.Name, llmdPreciseProducerType, producerName, PrecisePrefixCacheScorerType))
	}
	return nil
}

// resolveUpstreamTypes rewrites aliases to poolpicker types, drops inert
// plugins from profiles (after checking the references) and from an implicit
// default profile, and records a warning for each.
func (c *Config) resolveUpstreamTypes() error {
	if err := c.foldPrecise(); err != nil {
		return err
	}
	for i := range c.Plugins {
		p := &c.Plugins[i]
		if to, ok := pluginTypeAliases[p.Type]; ok {
			// Profiles refer to the instance by its upstream type.
			p.Name = p.nameOr()
			c.Warnings = append(c.Warnings, fmt.Sprintf("plugin %q: type %s is read as poolpicker's %s", p.nameOr(), p.Type, to))
			p.Type = to
		}
		if why, ok := inertPluginTypes[p.Type]; ok {
			c.Warnings = append(c.Warnings, fmt.Sprintf("plugin %q: type %s has nothing to do here (%s); its parameters are not read", p.nameOr(), p.Type, why))
		}
	}
	return nil
}

// dropInertRefs removes references to inert plugins from every profile.
func (c *Config) dropInertRefs() {
	inert := map[string]bool{}
	for _, p := range c.Plugins {
		if _, ok := inertPluginTypes[p.Type]; ok {
			inert[p.Name] = true
		}
	}
	for i := range c.SchedulingProfiles {
		c.SchedulingProfiles[i].Plugins = slices.DeleteFunc(c.SchedulingProfiles[i].Plugins, func(r PluginRef) bool { return inert[r.PluginRef] })
	}
}

func (p *PluginSpec) nameOr() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Type
}

// UsesConformanceTestPlugins reports whether the config declares an upstream
// conformance-test plugin (header-based-testing-filter or
// destination-endpoint-served-verifier): upstream's conformance manifests
// turn the conformance-test behaviours on that way, not by a flag.
func (c *Config) UsesConformanceTestPlugins() bool {
	return slices.ContainsFunc(c.Plugins, func(p PluginSpec) bool {
		return p.Type == ConformanceTestFilterType || p.Type == DestinationEndpointServedVerifierType
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
