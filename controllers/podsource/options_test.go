// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "zero", opts: Options{}},
		{name: "every plan", opts: Options{Plan: PlanNamespace, NamespaceWatchThreshold: 3}},
		{name: "bad plan", opts: Options{Plan: "per-namespace"}, wantErr: `pod watch plan "per-namespace": must be one of [auto per-pool namespace]`},
		{name: "negative threshold", opts: Options{NamespaceWatchThreshold: -1}, wantErr: "namespace watch threshold -1: must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := New(env.Config, Options{}); err == nil || !strings.Contains(err.Error(), "Registry is required") {
		t.Fatalf("New without a registry: %v", err)
	}
	if _, err := New(env.Config, Options{Registry: datastore.NewRegistry(), Plan: "x"}); err == nil || !strings.Contains(err.Error(), `pod watch plan "x"`) {
		t.Fatalf("New with a bad plan: %v", err)
	}
}
