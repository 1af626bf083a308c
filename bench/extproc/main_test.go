// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestHarness runs the harness small, so it keeps working; it checks the
// shape of the results, not speed (speed is read from `go run`).
func TestHarness(t *testing.T) {
	rows, err := run(context.Background(), config{requests: 50, rounds: 3, pools: 5, endpoints: 2, minimal: true, scheduler: true,
		bodies: []int{1 << 10, 64 << 10}, concurrency: []int{1, 4}})
	if err != nil {
		t.Fatal(err)
	}
	// noop, then both poolpicker servers.
	if len(rows) != 2*2*3 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.reqPerSec <= 0 || r.p50 <= 0 || r.p99 < r.p50 || r.ratioP50 <= 0 {
			t.Errorf("bad row %+v", r)
		}
	}
	var out bytes.Buffer
	print(&out, rows)
	if !strings.Contains(out.String(), "poolpicker+scheduler") || !strings.Contains(out.String(), "poolpicker+minimal-picker") {
		t.Fatalf("table:\n%s", out.String())
	}
}

func TestMakeBody(t *testing.T) {
	for _, n := range []int{1 << 10, 64 << 10} {
		b := makeBody(n)
		if len(b) != n || !json.Valid(b) {
			t.Fatalf("body of %d bytes (want %d), valid=%v", len(b), n, json.Valid(b))
		}
	}
}
