// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestCompatFlags(t *testing.T) {
	env := map[string]string{"NAMESPACE": "serving"}
	cases := []struct {
		name      string
		args      []string
		wantWarns []string
		wantErr   string
		check     func(t *testing.T, o *options)
	}{
		{name: "defaults", check: func(t *testing.T, o *options) {
			if o.compat.poolGroup != "inference.networking.k8s.io" || !o.observability.tracing || o.observability.enablePprof || !o.observability.metricsEndpointAuth ||
				o.logging.verbosity != 2 || o.extproc.HealthOnGRPCPort {
				t.Errorf("defaults %+v %+v", o.compat, o.logging)
			}
		}},
		{name: "upstream defaults set explicitly earn no warning", args: []string{"--tracing=false", "--enable-pprof=false", "--metrics-endpoint-auth=false",
			"--pool-group=inference.networking.k8s.io", "--disable-endpoint-subset-filter=false"}},
		{name: "each no-effect flag warns", args: []string{"--endpoint-selector=app=vllm",
			"--endpoint-target-ports=8000,8001", "--disable-endpoint-subset-filter", "--refresh-prometheus-metrics-interval=1s",
			"--enable-grpc-stream-metrics", "--allow-experimental-plugins",
			"--grpc-max-send-msg-size=10MiB"},
			wantWarns: []string{"--endpoint-selector=app=vllm",
				"--endpoint-target-ports=[8000,8001]", "--disable-endpoint-subset-filter=true", "--refresh-prometheus-metrics-interval=1s",
				"--enable-grpc-stream-metrics=true",
				"--allow-experimental-plugins=true", "--grpc-max-send-msg-size=10MiB"}},
		{name: "health checking on the ext_proc port", args: []string{"--health-checking"}, check: func(t *testing.T, o *options) {
			if !o.extproc.HealthOnGRPCPort {
				t.Error("--health-checking did not reach the ext_proc options")
			}
		}},
		{name: "pool namespace from NAMESPACE", args: []string{"--pool-name=p"}, check: func(t *testing.T, o *options) {
			if o.controllers.PoolNamespace != "serving" {
				t.Errorf("pool namespace %q, want $NAMESPACE", o.controllers.PoolNamespace)
			}
		}},
		{name: "explicit pool namespace wins", args: []string{"--pool-name=p", "--pool-namespace=other"}, check: func(t *testing.T, o *options) {
			if o.controllers.PoolNamespace != "other" {
				t.Errorf("pool namespace %q", o.controllers.PoolNamespace)
			}
		}},
		{name: "no pool name leaves the namespace alone", check: func(t *testing.T, o *options) {
			if o.controllers.PoolNamespace != "" {
				t.Errorf("pool namespace %q set without a pool name", o.controllers.PoolNamespace)
			}
		}},
		{name: "other pool group", args: []string{"--pool-group=inference.networking.x-k8s.io"}, wantErr: `--pool-group "inference.networking.x-k8s.io": poolpicker serves InferencePools of inference.networking.k8s.io (v1) only`},
		{name: "bad target port", args: []string{"--endpoint-target-ports=0"}, wantErr: "--endpoint-target-ports [0]: ports must be 1..65535"},
		{name: "receive limit", args: []string{"--grpc-max-recv-msg-size=20MiB"}, check: func(t *testing.T, o *options) {
			if o.extproc.MaxRecvMsgBytes != 20<<20 {
				t.Errorf("receive limit %d", o.extproc.MaxRecvMsgBytes)
			}
		}},
		{name: "receive limit unset follows the body limit", check: func(t *testing.T, o *options) {
			if o.extproc.MaxRecvMsgBytes != 0 {
				t.Errorf("receive limit %d set without the flag (0 lets the server follow --max-request-body-bytes)", o.extproc.MaxRecvMsgBytes)
			}
		}},
		{name: "zero receive limit", args: []string{"--grpc-max-recv-msg-size=0"}, wantErr: `--grpc-max-recv-msg-size "0": must be positive`},
		{name: "bad send size", args: []string{"--grpc-max-send-msg-size=lots"}, wantErr: `--grpc-max-send-msg-size "lots": not a size`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			err := completeCompat(&o, func(k string) string { return env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			warns := noEffectWarnings(fs)
			if len(warns) != len(c.wantWarns) {
				t.Fatalf("warnings %q, want one each for %q", warns, c.wantWarns)
			}
			for _, w := range c.wantWarns {
				if !slices.ContainsFunc(warns, func(s string) bool { return strings.HasPrefix(s, w+" has no effect: ") }) {
					t.Errorf("no warning about %s in %q", w, warns)
				}
			}
			if c.check != nil {
				c.check(t, &o)
			}
		})
	}
}

func TestParseByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want int
		err  bool
	}{
		{"10MiB", 10 << 20, false}, {"10Mi", 10 << 20, false}, {"25MB", 25e6, false}, {"1048576", 1 << 20, false},
		{" 4Ki ", 4096, false}, {"0", 0, false}, {"1.5Mi", 0, true},
		{"", 0, true}, {"B", 0, true}, {"-1", 0, true}, {"3GiB", 0, true}, {"ten", 0, true}, {"1.5", 0, true},
	}
	for _, c := range cases {
		got, err := parseByteSize(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
	}
}
