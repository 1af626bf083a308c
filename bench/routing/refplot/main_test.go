// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPerformancePageTableIsGenerated fails when the performance page's
// table against the reference EPP is not what the committed results give,
// or its plot is not the one they draw.
func TestPerformancePageTableIsGenerated(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "reference-results.json"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(data)
	if err != nil {
		t.Fatal(err)
	}
	var tbl strings.Builder
	if err := markdown(&tbl, rs); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "\n"+tbl.String()+"\n") {
		t.Errorf("site-src/performance.md lacks the table the results give; `go -C bench run ./routing/refplot -markdown` prints it:\n%s", tbl.String())
	}
	svg, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "images", "against-reference.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if string(svg) != plot(rs) {
		t.Error("site-src/images/against-reference.svg is not what the results draw; run `go -C bench run ./routing/refplot -svg ../site-src/images/against-reference.svg`")
	}
}

func TestReadResultsRefusesBadRuns(t *testing.T) {
	for name, data := range map[string]string{
		"not JSON":          `{`,
		"no runs":           `{"runs": []}`,
		"unknown router":    `{"runs": [{"groups": 6, "load": 50, "seed": 1, "router": "x", "hitRate": 0.9, "ttftP50": 0.1, "ttftP90": 0.2}]}`,
		"hit rate above 1":  `{"runs": [{"groups": 6, "load": 50, "seed": 1, "router": "reference-epp", "hitRate": 1.5, "ttftP50": 0.1, "ttftP90": 0.2}]}`,
		"p90 below p50":     `{"runs": [{"groups": 6, "load": 50, "seed": 1, "router": "reference-epp", "hitRate": 0.9, "ttftP50": 0.3, "ttftP90": 0.2}]}`,
		"no ratio for ours": `{"runs": [{"groups": 6, "load": 50, "seed": 1, "router": "poolpicker", "hitRate": 0.9, "ttftP50": 0.1, "ttftP90": 0.2}]}`,
	} {
		if _, err := readResults([]byte(data)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
