// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// upstreamEPPFlags are the flags of the Inference Extension's EPP at v1.5.0
// (pkg/epp/server/options.go, and the klog and zap flags its main binds) and
// the ones llm-d's router EPP adds that its charts pass, copied as data.
var upstreamEPPFlags = []string{
	"cache-info-metric", "cert-path", "config-file", "config-text", "disable-endpoint-subset-filter",
	"enable-cert-reload", "enable-pprof", "endpoint-selector", "endpoint-target-ports", "grpc-health-port",
	"grpc-port", "ha-enable-leader-election", "health-checking", "kv-cache-usage-percentage-metric",
	"lora-info-metric", "metrics-endpoint-auth", "metrics-port", "metrics-staleness-threshold",
	"model-server-metrics-https-insecure-skip-verify", "model-server-metrics-path", "model-server-metrics-port",
	"model-server-metrics-scheme", "pool-group", "pool-name", "pool-namespace", "refresh-metrics-interval",
	"refresh-prometheus-metrics-interval", "secure-serving", "total-queued-requests-metric",
	"total-running-requests-metric", "tracing",
	"kubeconfig", "v", "zap-encoder", "zap-log-level", "zap-devel", "zap-stacktrace-level", "zap-time-encoding",
	// llm-d's router EPP.
	"allow-experimental-plugins", "emit-endpoint-scores", "enable-grpc-stream-metrics", "grpc-max-recv-msg-size",
	"grpc-max-send-msg-size", "metrics-cert-dir", "metrics-client-ca-file", "tls-cipher-suites", "tls-min-version",
	"drain-timeout",
}

// TestMigratingPageFlags keeps the flag table of site-src/migrating.md true:
// every upstream flag has a row, every flag of a row is one poolpicker
// accepts, and a row says "accepted, no effect" exactly for the flags that
// earn the no-effect warning.
func TestMigratingPageFlags(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "migrating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "\n## Flags\n")
	if !ok {
		t.Fatal("site-src/migrating.md has no Flags section")
	}
	var o options
	fs := newFlagSet(io.Discard, &o)
	flagRE := regexp.MustCompile("`--?([a-z0-9-]+)`")
	status := map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		for _, m := range flagRE.FindAllStringSubmatch(cells[1], -1) {
			status[m[1]] = strings.TrimSpace(cells[2])
		}
	}
	if len(status) == 0 {
		t.Fatal("no flag rows found in the Flags table")
	}
	for name, st := range status {
		if fs.Lookup(name) == nil && !(name == "v" && fs.ShorthandLookup("v") != nil) {
			t.Errorf("the page lists --%s, which poolpicker does not accept", name)
		}
		noEffect := slices.ContainsFunc(noEffectFlags, func(f noEffectFlag) bool { return f.name == name })
		if noEffect != (st == "accepted, no effect") {
			t.Errorf("--%s: the page says %q; no-effect flag: %v", name, st, noEffect)
		}
	}
	for _, name := range upstreamEPPFlags {
		if _, ok := status[name]; !ok {
			t.Errorf("upstream flag --%s has no row on site-src/migrating.md", name)
		}
	}
}

// TestLimitsTableDefaults keeps the Limits table of site-src/operations.md
// true: each limit's flag exists and the default the table gives is the
// flag's.
func TestLimitsTableDefaults(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, text, ok := strings.Cut(string(doc), "\n## Limits\n")
	if !ok {
		t.Fatal("site-src/operations.md has no Limits section")
	}
	text, _, _ = strings.Cut(text, "\n## ")
	var o options
	fs := newFlagSet(io.Discard, &o)
	rowRE := regexp.MustCompile("\\| `--([a-z0-9-]+)` \\(([^)]+)\\) \\|")
	rows := rowRE.FindAllStringSubmatch(text, -1)
	if len(rows) < 5 {
		t.Fatalf("found %d limit rows in the Limits table, want at least 5", len(rows))
	}
	for _, m := range rows {
		name, documented := m[1], m[2]
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("the Limits table names --%s, which poolpicker does not accept", name)
			continue
		}
		want, err := docQuantity(documented)
		if err != nil {
			t.Errorf("--%s: the table's default %q: %v", name, documented, err)
			continue
		}
		got, err := docQuantity(f.DefValue)
		if err != nil {
			t.Errorf("--%s: default %q: %v", name, f.DefValue, err)
			continue
		}
		if got != want {
			t.Errorf("--%s: the Limits table says %q, the flag's default is %s", name, documented, f.DefValue)
		}
	}
}

// docQuantity reads a count, a byte size ("256 MiB") or a duration ("30 s",
// "10 min", or Go's "1m0s") as the docs and pflag write them, as a number of
// units (bytes, nanoseconds).
func docQuantity(s string) (float64, error) {
	s = strings.ReplaceAll(strings.TrimSpace(s), ",", "")
	if d, err := time.ParseDuration(s); err == nil {
		return float64(d), nil
	}
	num, unit, _ := strings.Cut(s, " ")
	n, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, err
	}
	scale := map[string]float64{"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
		"s": float64(time.Second), "min": float64(time.Minute), "ms": float64(time.Millisecond)}
	k, ok := scale[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q", unit)
	}
	return n * k, nil
}
