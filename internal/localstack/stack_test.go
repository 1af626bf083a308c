// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package localstack

import (
	"net"
	"testing"
)

func TestNextHost(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.2", "127.0.0.3"},
		{"127.0.0.253", "127.0.0.254"},
		{"127.0.0.254", "127.0.1.2"},
		{"127.0.255.254", "127.1.0.2"},
	}
	for _, tt := range tests {
		if got := nextHost(net.ParseIP(tt.in)).String(); got != tt.want {
			t.Errorf("nextHost(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
