// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scrape"
)

func TestSchedulingFlags(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "epp.yaml")
	cfg := "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: random-picker\nschedulingProfiles:\n- name: spread\n  plugins:\n  - pluginRef: random-picker\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	badPath := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badPath, []byte(strings.Replace(cfg, "queue-scorer", "queue-scorr", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name        string
		args        []string
		wantProfile string
		wantErr     []string
		check       func(t *testing.T, o scheduling.Options)
	}{
		{name: "defaults", args: nil, wantProfile: scheduling.DefaultProfileName, check: func(t *testing.T, o scheduling.Options) {
			if o.MaxEndpoints != 3 || o.MetricsStaleness != 2*time.Second || o.QueueDepthThreshold != 5 || o.KVCacheUtilThreshold != 0.8 {
				t.Fatalf("defaults %+v", o)
			}
		}},
		{name: "all flags", args: []string{"--config-file", cfgPath, "--scheduler-max-endpoints=2", "--saturation-queue-depth-threshold=9", "--saturation-kv-cache-threshold=0.9"}, wantProfile: "spread", check: func(t *testing.T, o scheduling.Options) {
			if o.MaxEndpoints != 2 || o.MetricsStaleness != 2*time.Second || o.QueueDepthThreshold != 9 || o.KVCacheUtilThreshold != 0.9 {
				t.Fatalf("options %+v", o)
			}
		}},
		{name: "config text", args: []string{"--config-text", cfg}, wantProfile: "spread"},
		{name: "file and text", args: []string{"--config-file", cfgPath, "--config-text", cfg}, wantErr: []string{"not both"}},
		{name: "unknown plugin in file", args: []string{"--config-file", badPath}, wantErr: []string{"bad.yaml", `"queue-scorr"`}},
		{name: "missing file", args: []string{"--config-file", filepath.Join(dir, "nope.yaml")}, wantErr: []string{"nope.yaml"}},
		{name: "zero endpoints", args: []string{"--scheduler-max-endpoints=0"}, wantErr: []string{"--scheduler-max-endpoints 0"}},
		{name: "KV threshold above 1", args: []string{"--saturation-kv-cache-threshold=80"}, wantErr: []string{"--saturation-kv-cache-threshold 80"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
			var o scheduling.Options
			bindSchedulingFlags(fs, &o)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			s, err := newScheduler(o, nil)
			if len(c.wantErr) > 0 {
				if err == nil {
					t.Fatalf("built, want an error naming %q", c.wantErr)
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
			if s.DefaultProfile() != c.wantProfile {
				t.Fatalf("default profile %q, want %q", s.DefaultProfile(), c.wantProfile)
			}
			if c.check != nil {
				c.check(t, o)
			}
		})
	}
}

// TestSchedulingFlagsDoNotCollide binds the scheduler's flags beside the
// other components' in one set: pflag panics on a name defined twice.
func TestSchedulingFlagsDoNotCollide(t *testing.T) {
	fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
	bindScrapeFlags(fs, &scrape.Options{})
	bindSchedulingFlags(fs, &scheduling.Options{})
	if fs.Lookup("config-file") == nil || fs.Lookup("metrics-staleness-threshold") == nil {
		t.Fatal("flags missing from the shared set")
	}
}
