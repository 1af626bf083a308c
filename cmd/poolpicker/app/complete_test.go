// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/flowcontrol"
)

// TestComplete checks complete alone: flags, environment and config file in,
// completed options (and the warnings to log) out, in its one order.
func TestComplete(t *testing.T) {
	const flowConfig = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nflowControl:\n  enabled: true\n  queueTTL: 5s\n  flowHeader: x-tenant\nplugins:\n- type: queue-scorer\n"
	const conformanceConfig = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: header-based-testing-filter\n- type: queue-scorer\n"
	type completed struct {
		flowControl      bool
		queueTTL         time.Duration
		flowHeader       string
		reservePercent   int
		poolNamespace    string
		poolSelector     string
		conformance      bool
		maxRecvMsgBytes  int
		warningsContains string
	}
	defaults := completed{queueTTL: flowcontrol.DefaultQueueTTL, reservePercent: 10, poolSelector: "poolpicker.io/picker=poolpicker"}
	with := func(f func(*completed)) completed { c := defaults; f(&c); return c }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    completed
		wantErr string
	}{
		{name: "defaults", want: defaults},
		{name: "the config's flow control where no flag is given", args: []string{"--config-text", flowConfig},
			want: with(func(c *completed) { c.flowControl, c.queueTTL, c.flowHeader = true, 5*time.Second, "x-tenant" })},
		{name: "a given flag wins over the config", args: []string{"--config-text", flowConfig, "--flow-control=false", "--flow-control-queue-ttl=9s"},
			want: with(func(c *completed) { c.queueTTL, c.flowHeader = 9*time.Second, "x-tenant" })},
		{name: "one fair-share reserve for every limit", args: []string{"--fair-share-reserve-percent=25"},
			want: with(func(c *completed) { c.reservePercent = 25 })},
		{name: "upstream's --pool-name takes $NAMESPACE", args: []string{"--pool-name=chat"}, env: map[string]string{"NAMESPACE": "team-a"},
			want: with(func(c *completed) { c.poolNamespace, c.poolSelector = "team-a", "" })},
		{name: "upstream's message size", args: []string{"--grpc-max-recv-msg-size=2MiB"},
			want: with(func(c *completed) { c.maxRecvMsgBytes = 2 << 20 })},
		{name: "conformance plugins turn the behaviours on with a warning", args: []string{"--config-text", conformanceConfig},
			want: with(func(c *completed) { c.conformance, c.warningsContains = true, "conformance-test plugins" })},
		{name: "another pool group", args: []string{"--pool-group=inference.networking.x-k8s.io"}, wantErr: "--pool-group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.scheduling.LoadConfig()
			if err != nil {
				t.Fatal(err)
			}
			warnings, err := complete(&o, completeInputs{getenv: func(k string) string { return tt.env[k] }, given: fs.Changed, config: cfg})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("complete: %v, want an error naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := completed{
				flowControl: o.flowControl.enabled, queueTTL: o.flowControl.opts.QueueTTL, flowHeader: o.flowControl.opts.FlowHeader,
				reservePercent: o.flowControl.opts.FairShareReservePercent, poolNamespace: o.controllers.PoolNamespace,
				poolSelector: o.controllers.PoolSelector, conformance: o.extproc.EnableConformanceTestBehaviors && o.scheduling.EnableConformanceTestFilter,
				maxRecvMsgBytes: o.extproc.MaxRecvMsgBytes, warningsContains: tt.want.warningsContains,
			}
			if got != tt.want {
				t.Errorf("completed %+v\nwant      %+v", got, tt.want)
			}
			if w := strings.Join(warnings, "\n"); tt.want.warningsContains == "" && w != "" || !strings.Contains(w, tt.want.warningsContains) {
				t.Errorf("warnings %q, want ones containing %q", w, tt.want.warningsContains)
			}
			if err := validate(&o); err != nil {
				t.Errorf("completed options do not validate: %v", err)
			}
		})
	}
}
