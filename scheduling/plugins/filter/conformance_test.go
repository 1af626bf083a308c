// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package filter

import "testing"

func TestConformanceSelects(t *testing.T) {
	cases := []struct {
		name        string
		tokens      []string
		ip, address string
		want        bool
	}{
		{"bare IP names every port", []string{"10.0.0.1"}, "10.0.0.1", "10.0.0.1:3002", true},
		{"ip:port names its endpoint", []string{"10.0.0.1:3002"}, "10.0.0.1", "10.0.0.1:3002", true},
		{"ip:port names no other port", []string{"10.0.0.1:3000"}, "10.0.0.1", "10.0.0.1:3002", false},
		{"other IP", []string{"10.0.0.2", "10.0.0.2:3002"}, "10.0.0.1", "10.0.0.1:3002", false},
		{"mixed list", []string{"10.0.0.9", "10.0.0.1:3004"}, "10.0.0.1", "10.0.0.1:3004", true},
		{"IPv6 bracketed with port", []string{"[fd00::1]:3002"}, "fd00::1", "[fd00::1]:3002", true},
		{"IPv6 bare", []string{"fd00::1"}, "fd00::1", "[fd00::1]:3002", true},
		{"IPv6 bracketed bare", []string{"[fd00::1]"}, "fd00::1", "[fd00::1]:3002", true},
		{"nothing named", []string{}, "10.0.0.1", "10.0.0.1:3002", false},
	}
	for _, c := range cases {
		if got := conformanceSelects(c.tokens, c.ip, c.address); got != c.want {
			t.Errorf("%s: conformanceSelects(%q, %s, %s) = %v", c.name, c.tokens, c.ip, c.address, got)
		}
	}
}
