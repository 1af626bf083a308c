// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// The config's fixed header, as in the reference EPP's EndpointPickerConfig.
const (
	ConfigAPIVersion = "inference.networking.x-k8s.io/v1alpha1"
	ConfigKind       = "EndpointPickerConfig"
)

// DefaultProfileName names the profile used when a config gives none, and
// the profile pools get when they name none (if the config has one by that
// name; otherwise the config's first profile).
const DefaultProfileName = "default"

// ProfileAnnotation on an InferencePool names the scheduling profile for the
// pool's requests. Read on every request, so a change applies at once.
// Unset, or naming no profile of the config, means the default profile.
const ProfileAnnotation = "poolpicker.io/scheduling-profile"

// DefaultConfigText is the configuration used when none is given: the
// subset filter, prefix-cache affinity weighed against load (a cached
// prefix counts for the prefill it saves, less queueCostTokens per request
// its holder has in flight beyond the least loaded endpoint, twice that
// while the prefixes in use leave the caches room; once the pool's
// streamed responses show what a request ahead costs in tokens of
// prefill, that cost while the caches have room and half of it after), LoRA
// affinity, and load scorers (poolpicker's in-flight count, the queue)
// with the max-score picker. The load scorers weigh half each: min-max
// normalised, together they are worth a third of a whole cached prompt, so
// a request follows its prefix, but among holders, and from a holder that
// is far busier than the rest, they spread the queues; weighing a tenth of
// that, queues piled up on the holders of hot prefixes once the pool was
// busy. KV-cache use is left out: it is highest on the servers holding the
// most prefixes, the ones that would serve from cache. A prompt no
// endpoint is worth sending to for its cache goes where every picker
// replica would send it (rendezvous hashing of its first 4 blocks, within
// 8 requests of the least load, weighed by the servers' cache sizes, and
// not to a server whose index holds more than a prompt beyond the least
// held), so replicas, each with its own index, place and spill a prefix
// alike, and few prefixes do not pile on one server.
const DefaultConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: subset-filter
- type: queue-scorer
- type: in-flight-scorer
- type: lora-affinity-scorer
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 64
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
    queueCostTokens: 192
    queueCostTokensWithRoom: 384
    rendezvousBlocks: 4
    rendezvousLoadSlack: 8
    rendezvousBalanceCache: true
    queueCostFromServers: true
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: subset-filter
  - pluginRef: queue-scorer
    weight: 0.5
  - pluginRef: in-flight-scorer
    weight: 0.5
  - pluginRef: lora-affinity-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`

// Config is a parsed EndpointPickerConfig. Build it with LoadConfig, which
// also checks it; a Config is a description, and every Scheduler built from
// it gets its own plugin instances.
type Config struct {
	APIVersion         string        `json:"apiVersion"`
	Kind               string        `json:"kind"`
	Plugins            []PluginSpec  `json:"plugins"`
	SchedulingProfiles []ProfileSpec `json:"schedulingProfiles,omitempty"`
	// FlowControl is poolpicker's flow control (queues in the picker); nil
	// when the config has no flowControl section.
	FlowControl *FlowControlConfig `json:"flowControl,omitempty"`
	// Warnings name what an upstream config asks that poolpicker reads past:
	// unimplemented fields and plugins whose job poolpicker does itself,
	// one line each, for the caller to log.
	Warnings []string `json:"-"`
}

// FlowControlConfig is the config's flowControl section: what the
// --flow-control-* flags set, for the flags not given on the command line.
// Durations are Go durations ("30s"); unset fields keep the flags' values.
// Fields of upstream's section that poolpicker does not read are reported
// in Config.Warnings.
type FlowControlConfig struct {
	Enabled         *bool  `json:"enabled,omitempty"`
	QueueTTL        string `json:"queueTTL,omitempty"`
	NoEndpointTTL   string `json:"noEndpointTTL,omitempty"`
	MaxBandRequests int    `json:"maxBandRequests,omitempty"`
	MaxBandBytes    int64  `json:"maxBandBytes,omitempty"`
	MaxBytes        int64  `json:"maxBytes,omitempty"`
	FlowHeader      string `json:"flowHeader,omitempty"`
}

// PluginSpec declares one plugin instance.
type PluginSpec struct {
	// Type is a registered plugin type (Options.Registry).
	Type string `json:"type"`
	// Name is what profiles refer to; empty means Type.
	Name string `json:"name,omitempty"`
	// Parameters are decoded by the type's factory.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ProfileSpec is a named list of plugin references.
type ProfileSpec struct {
	Name    string      `json:"name"`
	Plugins []PluginRef `json:"plugins"`
}

// PluginRef refers to a declared plugin; Weight applies to scorers only
// (omitted: 1).
type PluginRef struct {
	PluginRef string   `json:"pluginRef"`
	Weight    *float64 `json:"weight,omitempty"`
}

// DefaultConfig returns the parsed DefaultConfigText.
func DefaultConfig() *Config {
	cfg, err := LoadConfig([]byte(DefaultConfigText))
	if err != nil {
		panic("scheduling: built-in default config is invalid: " + err.Error())
	}
	return cfg
}

func loadConfigFile(path string, reg *framework.Registry) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	cfg, err := loadConfig(data, reg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// LoadConfig parses a YAML (or JSON) EndpointPickerConfig and checks it
// completely: header, unknown fields, plugin types and their parameters,
// profile references and weights. Every error names the culprit. A config
// without schedulingProfiles gets one profile named "default" that refers to
// every plugin, in order, each scorer with weight 1. Plugin types resolve
// to the built-in plugins (Options.LoadConfig takes a registry).
func LoadConfig(data []byte) (*Config, error) { return loadConfig(data, builtinRegistry) }

func loadConfig(data []byte, reg *framework.Registry) (*Config, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("scheduling config: empty")
	}
	data, fc, warns, err := stripUnimplementedFields(data)
	if err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	cfg := &Config{}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	cfg.Warnings = warns
	if cfg.FlowControl, warns, err = fc.read(); err != nil {
		return nil, fmt.Errorf("scheduling config: flowControl: %w", err)
	}
	cfg.Warnings = append(cfg.Warnings, warns...)
	if err := cfg.complete(reg); err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	// Building the plugins once is the only complete check of parameters.
	// The conformance option is New's to check: it is not known here.
	if _, err := buildProfiles(cfg, Options{EnableConformanceTestFilter: true, Registry: reg}); err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	return cfg, nil
}

// complete checks the structure and fills defaults (names, default profile).
func (c *Config) complete(reg *framework.Registry) error {
	if !slices.Contains(configAPIVersions, c.APIVersion) {
		return fmt.Errorf("apiVersion %q: must be \"%s\"", c.APIVersion, strings.Join(configAPIVersions, `" or "`))
	}
	if c.Kind != ConfigKind {
		return fmt.Errorf("kind %q: must be %q", c.Kind, ConfigKind)
	}
	if len(c.Plugins) == 0 {
		return fmt.Errorf("plugins: none declared")
	}
	if err := c.resolveUpstreamTypes(); err != nil {
		return err
	}
	names := make(map[string]int, len(c.Plugins))
	for i := range c.Plugins {
		p := &c.Plugins[i]
		if p.Type == "" {
			return fmt.Errorf("plugins[%d]: type is required", i)
		}
		if _, ok := reg.Factory(p.Type); !ok {
			return fmt.Errorf("plugins[%d]: unknown type %q (known: %s)", i, p.Type, strings.Join(pluginTypes(reg), ", "))
		}
		if p.Name == "" {
			p.Name = p.Type
		}
		if j, dup := names[p.Name]; dup {
			return fmt.Errorf("plugins[%d]: name %q already used by plugins[%d]; give each instance its own name", i, p.Name, j)
		}
		names[p.Name] = i
	}
	if len(c.SchedulingProfiles) == 0 {
		prof := ProfileSpec{Name: DefaultProfileName}
		for _, p := range c.Plugins {
			if _, inert := inertPluginTypes[p.Type]; !inert {
				prof.Plugins = append(prof.Plugins, PluginRef{PluginRef: p.Name})
			}
		}
		c.SchedulingProfiles = []ProfileSpec{prof}
	}
	profiles := make(map[string]int, len(c.SchedulingProfiles))
	for i, prof := range c.SchedulingProfiles {
		if prof.Name == "" {
			return fmt.Errorf("schedulingProfiles[%d]: name is required", i)
		}
		if j, dup := profiles[prof.Name]; dup {
			return fmt.Errorf("schedulingProfiles[%d]: name %q already used by schedulingProfiles[%d]", i, prof.Name, j)
		}
		profiles[prof.Name] = i
		seen := make(map[string]bool, len(prof.Plugins))
		for j, ref := range prof.Plugins {
			if ref.PluginRef == "" {
				return fmt.Errorf("profile %q plugins[%d]: pluginRef is required", prof.Name, j)
			}
			if _, ok := names[ref.PluginRef]; !ok {
				return fmt.Errorf("profile %q plugins[%d]: pluginRef %q names no declared plugin", prof.Name, j, ref.PluginRef)
			}
			if seen[ref.PluginRef] {
				return fmt.Errorf("profile %q: plugin %q referenced twice", prof.Name, ref.PluginRef)
			}
			seen[ref.PluginRef] = true
			if ref.Weight != nil && (*ref.Weight < 0 || *ref.Weight != *ref.Weight || *ref.Weight > 1e6) {
				return fmt.Errorf("profile %q plugin %q: weight %v must be between 0 and 1e6", prof.Name, ref.PluginRef, *ref.Weight)
			}
		}
	}
	c.dropInertRefs()
	return nil
}

// defaultProfile is the profile of pools that name none.
func (c *Config) defaultProfile() string {
	for _, p := range c.SchedulingProfiles {
		if p.Name == DefaultProfileName {
			return p.Name
		}
	}
	return c.SchedulingProfiles[0].Name
}

// ProfileNames lists the config's profiles in order.
func (c *Config) ProfileNames() []string {
	out := make([]string, len(c.SchedulingProfiles))
	for i, p := range c.SchedulingProfiles {
		out[i] = p.Name
	}
	return out
}
