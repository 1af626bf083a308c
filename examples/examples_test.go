// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package examples

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// exampleModules are the directories below this one with a go.mod.
func exampleModules(t *testing.T) []string {
	t.Helper()
	mods, err := filepath.Glob(filepath.Join("*", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) == 0 {
		t.Fatal("no example module found")
	}
	var dirs []string
	for _, m := range mods {
		dirs = append(dirs, filepath.Dir(m))
	}
	return dirs
}

// goCmd runs the go command of this toolchain in dir and fails with its
// output. The example's go.mod and go.sum are used as committed
// (-mod=readonly), as a user building it would.
func goCmd(t *testing.T, dir string, args ...string) {
	t.Helper()
	// No deadline: a build takes what it takes on a cold cache (go test's
	// -timeout still ends a hung run).
	// The go command on PATH, where go test puts its own toolchain first.
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %v in %s: %v\n%s\n(after changing poolpicker's dependencies, run go mod tidy in %s)", args, dir, err, bytes.TrimSpace(out.Bytes()), dir)
	}
}

// TestExamplesBuildAndPass builds every example module, its binaries
// included, vets it and runs its tests: the long-prompt scorer's test
// enables the plugin from a config file and checks the picks of a real
// ext_proc server.
func TestExamplesBuildAndPass(t *testing.T) {
	if testing.Short() {
		t.Skip("builds each example module (-short)")
	}
	for _, dir := range exampleModules(t) {
		t.Run(dir, func(t *testing.T) {
			goCmd(t, dir, "build", "-o", t.TempDir(), "./...")
			goCmd(t, dir, "vet", "./...")
			args := []string{"test", "-count=1"}
			if raceEnabled {
				args = append(args, "-race")
			}
			goCmd(t, dir, append(args, "./...")...)
		})
	}
}
