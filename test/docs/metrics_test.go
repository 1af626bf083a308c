// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// metricNameRE matches a Prometheus family named in a collector's options
// (Name: "poolpicker_..."), the families poolpicker defines.
var metricNameRE = regexp.MustCompile(`\bName:\s+"((?:poolpicker|inference)_[a-z0-9_]+)"`)

// TestMetricsPageListsEveryFamily: every metric family the product's code
// defines is named on site-src/metrics.md, so that an operator reading the
// page sees every series /metrics serves.
func TestMetricsPageListsEveryFamily(t *testing.T) {
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, "site-src", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// Benchmarks, tools and tests define no product metrics.
			switch rel {
			case "bench", "hack", "test", "examples", "site", "bin", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricNameRE.FindAllStringSubmatch(string(b), -1) {
			found[m[1]] = rel
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 20 {
		t.Fatalf("found only %d metric families in the code: the pattern no longer matches how collectors are declared", len(found))
	}
	for name, file := range found {
		if !strings.Contains(string(page), "`"+name+"`") {
			t.Errorf("%s (defined in %s) is not on site-src/metrics.md", name, file)
		}
	}
}
