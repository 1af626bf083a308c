// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package architecture_test keeps site-src/architecture.md's import graph
// true: the graph the page draws is the one `go list` reads from the code.
package architecture_test

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/poolpicker/poolpicker"

// graph maps a package (relative to the module) to the module's packages it
// imports, sorted.
type graph map[string][]string

// productGraph is the import graph of the packages the poolpicker binary is
// built from, read with `go list`: what users run, not the test helpers.
func productGraph(t *testing.T, root string) graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./cmd/poolpicker")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := graph{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], module+"/") {
			continue
		}
		pkg := strings.TrimPrefix(fields[0], module+"/")
		deps := []string{}
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				deps = append(deps, rel)
			}
		}
		slices.Sort(deps)
		g[pkg] = deps
	}
	return g
}

// documentedGraph reads the fenced block that follows the heading
// "## Package imports" in architecture.md: one line per package,
// "package: import import ...", or "package: -" for none.
func documentedGraph(t *testing.T, path string) graph {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := graph{}
	section, inBlock, seenBlock := false, false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Package imports"
		case section && strings.HasPrefix(line, "```"):
			if inBlock {
				return g
			}
			inBlock, seenBlock = true, true
		case inBlock:
			pkg, deps, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("%s:%d: %q is not \"package: imports\"", path, n, line)
			}
			pkg = strings.TrimSpace(pkg)
			if _, dup := g[pkg]; dup {
				t.Fatalf("%s:%d: %s listed twice", path, n, pkg)
			}
			list := strings.Fields(deps)
			if len(list) == 1 && list[0] == "-" {
				list = nil
			}
			list = append([]string{}, list...)
			slices.Sort(list)
			g[pkg] = list
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !seenBlock {
		t.Fatalf("%s: no fenced block under \"## Package imports\"", path)
	}
	t.Fatalf("%s: the block under \"## Package imports\" is not closed", path)
	return nil
}

// TestArchitecturePageImports fails when a package of the binary imports one
// of the module's packages the architecture page does not say it imports, or
// the page lists an import, or a package, that the code does not have.
func TestArchitecturePageImports(t *testing.T) {
	root := repoRoot(t)
	page := filepath.Join(root, "site-src", "architecture.md")
	real, doc := productGraph(t, root), documentedGraph(t, page)
	var problems []string
	for pkg, deps := range real {
		want, ok := doc[pkg]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: missing from the page (it imports %s)", pkg, orNone(deps)))
			continue
		}
		if !slices.Equal(deps, want) {
			problems = append(problems, fmt.Sprintf("%s: the code imports %s, the page says %s", pkg, orNone(deps), orNone(want)))
		}
	}
	for pkg := range doc {
		if _, ok := real[pkg]; !ok {
			problems = append(problems, fmt.Sprintf("%s: on the page but not a package of the binary", pkg))
		}
	}
	slices.Sort(problems)
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.Logf("update the block under \"## Package imports\" in %s to the code's:\n%s", page, real.block())
	}
}

// TestArchitectureRules checks the rules the page states in words, on the
// real graph: imports flow one way, and the plugin API, the datastore and
// the body reader stand alone.
func TestArchitectureRules(t *testing.T) {
	root := repoRoot(t)
	g := productGraph(t, root)
	for _, r := range []struct {
		pkg       string
		mayImport func(dep string) bool
		rule      string
	}{
		{"requestbody", none, "the body reader imports nothing of poolpicker's"},
		{"datastore", none, "the datastore imports nothing of poolpicker's"},
		{"scheduling/framework", none, "the plugin API imports nothing of poolpicker's"},
		{"scheduling/plugins/filter", framework, "a built-in plugin sees only the framework"},
		{"scheduling/plugins/load", framework, "a built-in plugin sees only the framework"},
		{"scheduling/plugins/lora", framework, "a built-in plugin sees only the framework"},
		{"scheduling/plugins/picker", framework, "a built-in plugin sees only the framework"},
		{"scheduling/plugins/prefix", notDatastore, "a plugin sees pools and endpoints only through the framework's views"},
		{"extproc", notScheduling, "the protocol reaches the scheduler only through the request controller"},
	} {
		deps, ok := g[r.pkg]
		if !ok {
			t.Errorf("%s: not a package of the binary", r.pkg)
			continue
		}
		for _, d := range deps {
			if !r.mayImport(d) {
				t.Errorf("%s imports %s: %s", r.pkg, d, r.rule)
			}
		}
	}
	// Nothing below the command imports it or the controllers' parts the
	// request path must not wait on.
	for pkg, deps := range g {
		for _, d := range deps {
			if strings.HasPrefix(d, "cmd/") && !strings.HasPrefix(pkg, "cmd/") {
				t.Errorf("%s imports %s: only the command assembles the process", pkg, d)
			}
			if (strings.HasPrefix(pkg, "extproc") || strings.HasPrefix(pkg, "requestcontrol")) && strings.HasPrefix(d, "controllers") {
				t.Errorf("%s imports %s: the request path never waits on the controllers", pkg, d)
			}
		}
	}
}

// repoRoot is the module's directory, as the go command finds it from the
// test's working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("go env GOMOD: not inside the module")
	}
	return filepath.Dir(gomod)
}

// block is the graph as the page writes it.
func (g graph) block() string {
	var b strings.Builder
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		deps := "-"
		if len(g[pkg]) > 0 {
			deps = strings.Join(g[pkg], " ")
		}
		fmt.Fprintf(&b, "%s: %s\n", pkg, deps)
	}
	return b.String()
}

func none(string) bool { return false }

func framework(dep string) bool { return dep == "scheduling/framework" }

// notDatastore allows every import but the datastore.
func notDatastore(dep string) bool { return dep != "datastore" }

// notScheduling allows every import but the scheduler and its parts.
func notScheduling(dep string) bool { return !strings.HasPrefix(dep, "scheduling") }

func orNone(deps []string) string {
	if len(deps) == 0 {
		return "nothing"
	}
	return strings.Join(deps, ", ")
}
