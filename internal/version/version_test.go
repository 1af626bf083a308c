// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestGetPrefersStampedValues(t *testing.T) {
	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })

	tests := []struct {
		name          string
		version       string
		commit        string
		wantVersion   string
		wantCommitSet bool
	}{
		{name: "stamped", version: "v1.2.3", commit: "abc123", wantVersion: "v1.2.3", wantCommitSet: true},
		// A test binary has no module version and no VCS stamp.
		{name: "unstamped", wantVersion: "devel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			Version, Commit = tt.version, tt.commit
			got := Get()
			if got.Version != tt.wantVersion {
				t.Errorf("Version = %q, want %q", got.Version, tt.wantVersion)
			}
			if tt.wantCommitSet && got.Commit != tt.commit {
				t.Errorf("Commit = %q, want %q", got.Commit, tt.commit)
			}
			if got.Commit == "" {
				t.Error("Commit is empty; want a value or \"unknown\"")
			}
			if got.GoVersion != runtime.Version() {
				t.Errorf("GoVersion = %q, want %q", got.GoVersion, runtime.Version())
			}
			if s := got.String(); !strings.Contains(s, got.Version) || !strings.Contains(s, got.Commit) {
				t.Errorf("String() = %q, want the version and commit in it", s)
			}
		})
	}
}

// TestLinkerFlagsStamp builds a program with -ldflags -X, as `make image`
// does, and checks that the values reach Get.
func TestLinkerFlagsStamp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "stamped")
	const pkg = "github.com/poolpicker/poolpicker/internal/version"
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X "+pkg+".Version=v9.8.7 -X "+pkg+".Commit=0123abcd", "./testdata/stamped")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("running the stamped program: %v", err)
	}
	if got, want := string(out), "v9.8.7 0123abcd"; got != want {
		t.Errorf("stamped program printed %q, want %q", got, want)
	}
}
