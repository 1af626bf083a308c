// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
			if o.MaxEndpoints != scheduling.DefaultMaxEndpoints || o.MetricsStaleness != 0 || o.QueueDepthThreshold != scheduling.DefaultQueueDepthThreshold || o.KVCacheUtilThreshold != scheduling.DefaultKVCacheUtilThreshold {
				t.Fatalf("defaults %+v", o)
			}
		}},
		{name: "all flags", args: []string{"--config-file", cfgPath, "--scheduler-max-endpoints=2", "--saturation-queue-depth-threshold=9", "--saturation-kv-cache-threshold=0.9"}, wantProfile: "spread", check: func(t *testing.T, o scheduling.Options) {
			if o.MaxEndpoints != 2 || o.QueueDepthThreshold != 9 || o.KVCacheUtilThreshold != 0.9 {
				t.Fatalf("options %+v", o)
			}
		}},
		{name: "config text", args: []string{"--config-text", cfg}, wantProfile: "spread"},
		{name: "file and text", args: []string{"--config-file", cfgPath, "--config-text", cfg}, wantErr: []string{"not both"}},
		{name: "unknown plugin in file", args: []string{"--config-file", badPath}, wantErr: []string{"bad.yaml", `"queue-scorr"`}},
		{name: "missing file", args: []string{"--config-file", filepath.Join(dir, "nope.yaml")}, wantErr: []string{"nope.yaml"}},
		{name: "zero means the default", args: []string{"--scheduler-max-endpoints=0", "--saturation-queue-depth-threshold=0", "--saturation-kv-cache-threshold=0"}, wantProfile: scheduling.DefaultProfileName},
		{name: "negative endpoints", args: []string{"--scheduler-max-endpoints=-1"}, wantErr: []string{"max endpoints -1"}},
		{name: "negative queue depth", args: []string{"--saturation-queue-depth-threshold=-2"}, wantErr: []string{"queue depth threshold -2"}},
		{name: "KV threshold above 1", args: []string{"--saturation-kv-cache-threshold=80"}, wantErr: []string{"KV-cache threshold 80"}},
		{name: "every error at once", args: []string{"--scheduler-max-endpoints=-1", "--saturation-kv-cache-threshold=-0.5"}, wantErr: []string{"max endpoints -1", "KV-cache threshold -0.5"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
			var o scheduling.Options
			bindSchedulingFlags(fs, &o)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			s, err := scheduling.New(nil, o)
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
