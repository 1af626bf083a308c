// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package localstack

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 5 {
		t.Fatalf("%d ports, want 5", len(ports))
	}
	hi := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
		if hi-portFloor >= 1000 && (p < portFloor || p >= hi) {
			t.Errorf("port %d outside [%d, %d), below the ephemeral range", p, portFloor, hi)
		}
		// Free on every interface: the picker binds them so.
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d not free: %v", p, err)
			continue
		}
		l.Close()
	}
}
