// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", ""}, "--kubeconfig (or $KUBECONFIG) is required"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig /nonexistent/kubeconfig"},
		{[]string{"--kubeconfig", "x", "--epp-address", "nope"}, `--epp-address "nope"`},
		{[]string{"--kubeconfig", "x", "--gateway", "justname"}, `--gateway "justname": want namespace/name`},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"--kubeconfig", "x", "extra"}, `unexpected arguments ["extra"]`},
	}
	for _, tt := range tests {
		t.Setenv("KUBECONFIG", "")
		err := run(context.Background(), tt.args, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want error containing %q", tt.args, err, tt.want)
		}
	}
}
