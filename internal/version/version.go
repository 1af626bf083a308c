// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package version holds poolpicker's version and commit, stamped at link time.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version and Commit are set at link time, for example:
//
//	go build -ldflags "-X github.com/poolpicker/poolpicker/internal/version.Version=v0.3.0 \
//	  -X github.com/poolpicker/poolpicker/internal/version.Commit=$(git rev-parse HEAD)"
//
// `make image` and the Dockerfile do this. Left empty, Get falls back to
// what the Go toolchain recorded (the module version and the VCS revision of
// a build inside a git checkout), then to "devel" and "unknown".
var (
	Version string
	Commit  string
)

// Info is the build identity that --version prints and the build-info
// metrics export.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
	// Modified reports a build from a work tree with uncommitted changes,
	// as the toolchain recorded it; false when unknown.
	Modified bool
}

// Get returns the stamped identity, completed from the binary's build
// information where the linker flags were not given.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Commit == "" {
					info.Commit = s.Value
				}
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the one line that `poolpicker --version` prints.
func (i Info) String() string {
	s := "poolpicker " + i.Version + " (commit " + i.Commit
	if i.Modified {
		s += ", modified"
	}
	return s + ", " + i.GoVersion + ")"
}
