// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallPageTableIsGenerated fails when the sizing table of
// site-src/install.md is not what the generator makes of the committed
// results: edit the results (by running the harness), never the table.
func TestInstallPageTableIsGenerated(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := table(data)
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := splice(string(page), tbl)
	if err != nil {
		t.Fatalf("site-src/install.md: %v", err)
	}
	if want != string(page) {
		t.Errorf("the sizing table of site-src/install.md differs from the results; run `go -C bench run ./scale/sizingtable -write`. Generated:\n%s", tbl)
	}
}

func TestTable(t *testing.T) {
	results := `[
	 {"pools": 10000, "pods": 5, "plan": "", "hotRate": 200, "syncSeconds": 9.14, "requestsAtSync": 40,
	  "pickerPeakRSS": 683671552, "pickerHeapInuse": 411041792, "pickerIdleCPU": 0.231, "pickerHotCPU": 0.858,
	  "apiServerSteadyRSS": 1048576000, "apiServerPeakRSS": 1101004800, "coldPickP99Ms": 3.6},
	 {"pools": 1000, "pods": 5, "plan": "", "hotRate": 200, "syncSeconds": 2.14, "requestsAtSync": 37,
	  "pickerPeakRSS": 157286400, "pickerHeapInuse": 90177536, "pickerIdleCPU": 0.045, "pickerHotCPU": 0.265,
	  "apiServerSteadyRSS": 502267904, "apiServerPeakRSS": 552599552, "coldPickP99Ms": 3.51},
	 {"pools": 3000, "pods": 5, "plan": "per-pool", "syncSeconds": 60.2},
	 {"pools": 300, "pods": 5, "plan": "", "pickerArgs": "--kube-api-qps=300", "syncSeconds": 1}
	]`
	got, err := table([]byte(results))
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(got), "\n")
	if len(rows) != 4 {
		t.Fatalf("want a header, a separator and the two default-flag runs, got:\n%s", got)
	}
	for i, want := range []string{
		"| 1,000 (5) | 150 MiB | 86 MiB | 0.04 core | 0.27 core at 200 picks/s | 2.1 s | 37 | 48 MiB | 3.5 ms |",
		"| 10,000 (5) | 652 MiB | 392 MiB | 0.23 core | 0.86 core at 200 picks/s | 9.1 s | 40 | 50 MiB | 3.6 ms |",
	} {
		if rows[2+i] != want {
			t.Errorf("row %d:\n got %s\nwant %s", i, rows[2+i], want)
		}
	}

	for _, bad := range []string{`{`, `[{"pools": 100, "plan": "namespace"}]`} {
		if _, err := table([]byte(bad)); err == nil {
			t.Errorf("table(%s): no error", bad)
		}
	}
}

func TestSplice(t *testing.T) {
	page := "intro\n" + beginMarker + "\nold table\n" + endMarker + "\noutro\n"
	got, err := splice(page, "| new |\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "intro\n" + beginMarker + "\n\n| new |\n\n" + endMarker + "\noutro\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := splice("no markers", "x"); err == nil {
		t.Error("a page without the markers: no error")
	}
	if _, err := splice(beginMarker+"\nno end", "x"); err == nil {
		t.Error("a page without the end marker: no error")
	}
}
