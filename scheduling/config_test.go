// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

const header = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

func TestDefaultConfig(t *testing.T) {
	cfg := DefaultConfig()
	if got := cfg.ProfileNames(); len(got) != 1 || got[0] != DefaultProfileName {
		t.Fatalf("profiles %v", got)
	}
	b, err := buildProfiles(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := b.profiles[DefaultProfileName]
	var scorers []string
	for _, s := range p.scorers {
		scorers = append(scorers, s.TypedName().Type)
	}
	want := []string{QueueScorerType, InFlightScorerType, LoRAAffinityScorerType, PrefixCacheScorerType}
	if strings.Join(scorers, ",") != strings.Join(want, ",") {
		t.Fatalf("default scorers %v, want %v", scorers, want)
	}
	if p.picker.TypedName().Type != MaxScorePickerType || len(p.filters) != 1 || p.filters[0].TypedName().Type != SubsetFilterType {
		t.Fatalf("default profile: picker %v filters %d", p.picker.TypedName(), len(p.filters))
	}
	if len(p.postPickers) != 1 {
		t.Fatalf("default profile has %d post-pickers, want the prefix scorer", len(p.postPickers))
	}
}

// TestDefaultLearnedParamsAreTheDefaultProfiles: a precise scorer without
// learned-index parameters routes by the default profile's prefix-cache
// rules, so the two must not drift apart; rendezvousNeedsRoom and
// rendezvousBalanceNewPrefix are the precise scorer's own.
func TestDefaultLearnedParamsAreTheDefaultProfiles(t *testing.T) {
	var profile map[string]any
	for _, p := range DefaultConfig().Plugins {
		if p.Type == PrefixCacheScorerType {
			if err := json.Unmarshal(p.Parameters, &profile); err != nil {
				t.Fatal(err)
			}
		}
	}
	var learned map[string]any
	if err := json.Unmarshal([]byte(prefix.DefaultLearnedParams), &learned); err != nil {
		t.Fatal(err)
	}
	for _, own := range []string{"rendezvousNeedsRoom", "rendezvousBalanceNewPrefix"} {
		if learned[own] != true || profile[own] != nil {
			t.Errorf("%s: %v in prefix.DefaultLearnedParams, %v in the default profile; want true and unset", own, learned[own], profile[own])
		}
		delete(learned, own)
	}
	if !reflect.DeepEqual(profile, learned) {
		t.Errorf("prefix.DefaultLearnedParams %v, the default profile's prefix-cache-scorer %v", learned, profile)
	}
}

func TestLoadConfig(t *testing.T) {
	cases := []struct {
		name string
		text string
		// check inspects the built config; nil when the load must fail.
		check func(t *testing.T, b *builtConfig)
		// wantErr are substrings of the error, naming the culprit.
		wantErr []string
	}{
		{
			name: "reference-style config with handler and weights",
			text: header + `plugins:
- type: single-profile-handler
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 32
    maxPrefixBlocksToMatch: 128
    lruCapacityPerServer: 1000
- type: max-score-picker
  parameters:
    maxNumOfEndpoints: 2
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1.5
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`,
			check: func(t *testing.T, b *builtConfig) {
				p := b.profiles["default"]
				if len(p.scorers) != 3 || p.scorers[1].weight != 1.5 || p.pickerMax != 2 {
					t.Fatalf("profile %+v", p)
				}
				// The parameters reach the scorer's factory: 128 blocks of
				// 32 bytes are the prompt it reads (its defaults and bounds are
				// prefix's TestParams).
				if got := p.scorers[2].Scorer.(framework.PromptReader).PromptBytes(); got != 32*128 {
					t.Fatalf("prefix scorer reads %d prompt bytes, want 32 x 128", got)
				}
			},
		},
		{
			name: "no profiles: one default profile with every plugin",
			text: header + `plugins:
- type: queue-scorer
- name: q2
  type: queue-scorer
- type: random-picker
`,
			check: func(t *testing.T, b *builtConfig) {
				p := b.profiles[DefaultProfileName]
				if p == nil || len(p.scorers) != 2 || p.picker.TypedName().Type != RandomPickerType {
					t.Fatalf("profile %+v", p)
				}
				if p.scorers[0].weight != 1 || p.scorers[1].TypedName().Name != "q2" {
					t.Fatalf("scorers %+v", p.scorers)
				}
			},
		},
		{
			name: "no picker: max-score added; no subset filter: added first",
			text: header + `plugins:
- type: queue-scorer
schedulingProfiles:
- name: a
  plugins:
  - pluginRef: queue-scorer
- name: b
  plugins: []
`,
			check: func(t *testing.T, b *builtConfig) {
				if b.defaultProfile != "a" {
					t.Fatalf("default profile %q, want the first, a", b.defaultProfile)
				}
				for _, name := range []string{"a", "b"} {
					p := b.profiles[name]
					if p.picker.TypedName().Type != MaxScorePickerType || p.filters[0].TypedName().Type != SubsetFilterType {
						t.Fatalf("profile %s: picker %v filters %v", name, p.picker.TypedName(), p.filters)
					}
				}
			},
		},
		{
			name: "JSON is YAML too",
			text: `{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"EndpointPickerConfig","plugins":[{"type":"weighted-random-picker"}]}`,
			check: func(t *testing.T, b *builtConfig) {
				if b.profiles["default"].picker.TypedName().Type != WeightedRandomPickerType {
					t.Fatal("picker not built")
				}
			},
		},
		{name: "empty", text: "  \n", wantErr: []string{"empty"}},
		{name: "not yaml", text: "plugins: [", wantErr: []string{"scheduling config"}},
		{name: "wrong kind", text: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: Pod\nplugins: [{type: queue-scorer}]\n", wantErr: []string{`kind "Pod"`, ConfigKind}},
		{name: "wrong apiVersion", text: "apiVersion: v1\nkind: EndpointPickerConfig\nplugins: [{type: queue-scorer}]\n", wantErr: []string{`apiVersion "v1"`}},
		{name: "unknown top-level field", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfile: []\n", wantErr: []string{"schedulingProfile"}},
		{name: "no plugins", text: header + "plugins: []\n", wantErr: []string{"plugins: none"}},
		{name: "unknown type", text: header + "plugins: [{type: queue-scorer}, {type: magic-scorer, name: wand}]\n", wantErr: []string{"plugins[1]", `"magic-scorer"`, "queue-scorer"}},
		{name: "missing type", text: header + "plugins: [{name: x}]\n", wantErr: []string{"plugins[0]", "type is required"}},
		{name: "duplicate name", text: header + "plugins: [{type: queue-scorer}, {type: queue-scorer}]\n", wantErr: []string{`name "queue-scorer"`, "plugins[0]"}},
		{name: "unknown parameter", text: header + "plugins:\n- type: prefix-cache-scorer\n  name: prefix\n  parameters: {hashBlocSize: 64}\n", wantErr: []string{`plugin "prefix"`, "prefix-cache-scorer", "hashBlocSize"}},
		{name: "mistyped parameter", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {hashBlockSize: big}\n", wantErr: []string{"prefix-cache-scorer", "hashBlockSize"}},
		{name: "negative parameter", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: -5}\n", wantErr: []string{"lruCapacityPerServer -5"}},
		{name: "huge parameter", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: 99999999999}\n", wantErr: []string{"lruCapacityPerServer"}},
		{name: "a learned queue cost without one to learn", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {queueCostFromServers: true}\n", wantErr: []string{"prefix-cache-scorer", "queueCostFromServers", "queueCostTokens"}},
		{name: "a new prefix's bound without the balance", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {rendezvousBlocks: 4, rendezvousBalanceNewPrefix: true}\n", wantErr: []string{"prefix-cache-scorer", "rendezvousBalanceNewPrefix", "rendezvousBalanceCache"}},
		{name: "a cost beyond the batch without the fit", text: header + "plugins:\n- type: prefix-cache-scorer\n  parameters: {queueCostTokens: 192, queueCostBeyondBatch: true}\n", wantErr: []string{"prefix-cache-scorer", "queueCostBeyondBatch", "queueCostFromServers"}},
		{name: "parameters on parameterless plugin", text: header + "plugins:\n- type: queue-scorer\n  parameters: {threshold: 3}\n", wantErr: []string{"queue-scorer", "threshold"}},
		{name: "bad picker parameter", text: header + "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: -1}\n", wantErr: []string{"max-score-picker", "maxNumOfEndpoints -1"}},
		{name: "dangling ref", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins: [{pluginRef: kv-cache-utilization-scorer}]\n", wantErr: []string{`profile "p"`, `"kv-cache-utilization-scorer"`, "no declared plugin"}},
		{name: "empty ref", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins: [{weight: 2}]\n", wantErr: []string{`profile "p"`, "pluginRef is required"}},
		{name: "ref twice", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer}, {pluginRef: queue-scorer}]\n", wantErr: []string{"referenced twice"}},
		{name: "profile without name", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- plugins: [{pluginRef: queue-scorer}]\n", wantErr: []string{"schedulingProfiles[0]", "name is required"}},
		{name: "duplicate profile", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins: []\n- name: p\n  plugins: []\n", wantErr: []string{`name "p"`}},
		{name: "negative weight", text: header + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins: [{pluginRef: queue-scorer, weight: -1}]\n", wantErr: []string{"weight -1"}},
		{name: "weight on a picker", text: header + "plugins: [{type: random-picker}]\nschedulingProfiles:\n- name: p\n  plugins: [{pluginRef: random-picker, weight: 2}]\n", wantErr: []string{`"random-picker"`, "not a scorer"}},
		{name: "two pickers", text: header + "plugins: [{type: random-picker}, {type: max-score-picker}]\n", wantErr: []string{"two pickers", "random-picker", "max-score-picker"}},
		{name: "handler in a profile", text: header + "plugins: [{type: single-profile-handler}]\nschedulingProfiles:\n- name: p\n  plugins: [{pluginRef: single-profile-handler}]\n", wantErr: []string{"not a filter, scorer or picker"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := LoadConfig([]byte(c.text))
			if c.check == nil {
				if err == nil {
					t.Fatalf("loaded, want an error containing %q", c.wantErr)
				}
				for _, w := range c.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("error %q does not name %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := buildProfiles(cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, b)
		})
	}
}

func TestConformanceFilterNeedsOption(t *testing.T) {
	cfg, err := LoadConfig([]byte(header + "plugins: [{type: header-based-testing-filter}, {type: queue-scorer}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), ConformanceTestFilterType) {
		t.Fatalf("New without the conformance option: %v, want an error naming the filter", err)
	}
	s, err := New(cfg, Options{EnableConformanceTestFilter: true})
	if err != nil {
		t.Fatal(err)
	}
	if f := s.built.profiles[DefaultProfileName].filters; len(f) != 2 {
		t.Fatalf("filters %v, want subset then the named conformance filter", f)
	}
}

func TestOptionsLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(twoProfiles), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"plugins: [{type: nope}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		opts     Options
		profiles string
		wantErr  string
	}{
		{"default", Options{}, "default", ""},
		{"file", Options{ConfigFile: good}, "default,random", ""},
		{"text", Options{ConfigText: twoProfiles}, "default,random", ""},
		{"both", Options{ConfigFile: good, ConfigText: twoProfiles}, "", "not both"},
		{"missing file", Options{ConfigFile: filepath.Join(dir, "none.yaml")}, "", "none.yaml"},
		{"bad file", Options{ConfigFile: bad}, "", "bad.yaml"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(nil, c.opts)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, n := range []string{"default", "random"} {
				if s.built.profiles[n] != nil {
					names = append(names, n)
				}
			}
			if strings.Join(names, ",") != c.profiles {
				t.Fatalf("profiles %v, want %s", names, c.profiles)
			}
		})
	}
}

// FuzzLoadConfig: any input loads or fails with an error; never a panic or
// a config whose plugins cannot be built.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte(DefaultConfigText))
	f.Add([]byte(twoProfiles))
	f.Add([]byte(header + "plugins: [{type: prefix-cache-scorer, parameters: {hashBlockSize: 1}}]\n"))
	f.Add([]byte(header + "plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: x, plugins: [{pluginRef: queue-scorer, weight: 1e300}]}]\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte(header + "plugins:\n- type: max-score-picker\n  parameters: [1, 2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := LoadConfig(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		s, err := New(cfg, Options{EnableConformanceTestFilter: true})
		if err != nil {
			t.Fatalf("loaded config does not build: %v", err)
		}
		if s.built.profiles[s.DefaultProfile()] == nil {
			t.Fatal("no default profile")
		}
	})
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		o       Options
		wantErr []string
	}{
		{name: "zero means every default", o: Options{}},
		{name: "in range", o: Options{MaxEndpoints: 1, MetricsStaleness: time.Second, QueueDepthThreshold: 1, KVCacheUtilThreshold: 1}},
		{name: "negative endpoints", o: Options{MaxEndpoints: -1}, wantErr: []string{"max endpoints -1"}},
		{name: "negative staleness", o: Options{MetricsStaleness: -time.Second}, wantErr: []string{"staleness -1s"}},
		{name: "negative queue depth", o: Options{QueueDepthThreshold: -3}, wantErr: []string{"queue depth threshold -3"}},
		{name: "KV threshold above 1", o: Options{KVCacheUtilThreshold: 1.5}, wantErr: []string{"KV-cache threshold 1.5"}},
		{name: "KV threshold NaN", o: Options{KVCacheUtilThreshold: math.NaN()}, wantErr: []string{"KV-cache threshold NaN"}},
		{name: "file and text", o: Options{ConfigFile: "a.yaml", ConfigText: "x"}, wantErr: []string{"not both"}},
		{name: "every error joined", o: Options{MaxEndpoints: -1, QueueDepthThreshold: -1}, wantErr: []string{"max endpoints -1", "queue depth threshold -1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Validate()
			if len(c.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := New(nil, c.o); err != nil {
					t.Fatalf("valid options refused by New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("valid, want an error naming %q", c.wantErr)
			}
			for _, w := range c.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not name %q", err, w)
				}
			}
			if _, nerr := New(nil, c.o); nerr == nil || nerr.Error() != err.Error() {
				t.Fatalf("New: %v, want Validate's error %v", nerr, err)
			}
		})
	}
}
