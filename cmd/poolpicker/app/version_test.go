// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/internal/version"
	"github.com/poolpicker/poolpicker/scheduling"
)

// TestVersionFlagPrintsAndExits runs the built binary with --version: it
// prints one line naming the version and commit and exits 0 without a
// cluster, even beside flags that would need one.
func TestVersionFlagPrintsAndExits(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--version", "--kubeconfig=/nonexistent"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, err := exec.Command(binary, args...).Output()
			if err != nil {
				t.Fatalf("poolpicker %v: %v", args, err)
			}
			line := strings.TrimSpace(string(out))
			if !strings.HasPrefix(line, "poolpicker ") || !strings.Contains(line, "(commit ") || strings.Count(line, "\n") != 0 {
				t.Errorf("--version printed %q, want one line \"poolpicker <version> (commit <sha>, <go>)\"", line)
			}
		})
	}
}

// TestBuildInfoMetric gathers the registry build makes: poolpicker_build_info
// is 1 and labelled with the identity --version prints.
func TestBuildInfoMetric(t *testing.T) {
	var o options
	if err := newFlagSet(io.Discard, &o).Parse(nil); err != nil {
		t.Fatal(err)
	}
	cs, err := build(&o, scheduling.DefaultConfig(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	families, err := cs.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := version.Get()
	for _, f := range families {
		if f.GetName() != "poolpicker_build_info" {
			continue
		}
		m := f.GetMetric()
		if len(m) != 1 || m[0].GetGauge().GetValue() != 1 {
			t.Fatalf("poolpicker_build_info = %v, want one series of value 1", m)
		}
		labels := map[string]string{}
		for _, l := range m[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != want.Version || labels["commit"] != want.Commit || labels["goversion"] != want.GoVersion {
			t.Errorf("labels %v, want version %q commit %q goversion %q", labels, want.Version, want.Commit, want.GoVersion)
		}
		return
	}
	t.Fatal("poolpicker_build_info is not in the registry")
}
