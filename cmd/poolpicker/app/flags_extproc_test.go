// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/extproc"
)

func TestBindExtprocFlags(t *testing.T) {
	cases := []struct {
		args  []string
		check func(o extproc.Options) bool
	}{
		{nil, func(o extproc.Options) bool {
			return o.GRPCPort == 9002 && o.HealthPort == 9003 && !o.Insecure && o.MaxRequestBodyBytes == 16<<20 && o.DrainTimeout == 30*time.Second && !o.TrustPoolHeader
		}},
		{nil, func(o extproc.Options) bool { return o.MaxSubsetHintEntries == 10_000 && o.MaxModelLabels == 1024 }},
		{[]string{"--max-subset-hint-entries=3", "--max-model-labels=5"}, func(o extproc.Options) bool {
			return o.MaxSubsetHintEntries == 3 && o.MaxModelLabels == 5
		}},
		{[]string{"--secure-serving=false"}, func(o extproc.Options) bool { return o.Insecure }},
		{[]string{"--secure-serving"}, func(o extproc.Options) bool { return !o.Insecure }},
		{[]string{"--grpc-port=1", "--grpc-health-port=2", "--cert-path=/c", "--enable-cert-reload", "--max-request-body-bytes=10",
			"--trust-pool-header", "--enable-conformance-test-behaviors", "--drain-timeout=5s"}, func(o extproc.Options) bool {
			return o.GRPCPort == 1 && o.HealthPort == 2 && o.CertPath == "/c" && o.EnableCertReload && o.MaxRequestBodyBytes == 10 &&
				o.TrustPoolHeader && o.EnableConformanceTestBehaviors && o.DrainTimeout == 5*time.Second
		}},
	}
	for _, c := range cases {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var o extproc.Options
		bindExtprocFlags(fs, &o)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if !c.check(o) {
			t.Errorf("%v: options %+v", c.args, o)
		}
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	bindExtprocFlags(fs, &extproc.Options{})
	if err := fs.Parse([]string{"--secure-serving=maybe"}); err == nil {
		t.Error("bad bool accepted")
	}
}
