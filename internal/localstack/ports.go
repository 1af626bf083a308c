// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package localstack

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// portFloor is the lowest port FreePorts draws: above the well-known and
// the commonly configured ones.
const portFloor = 10000

// FreePorts returns n distinct TCP ports free on every interface at the
// time of the call, for the processes a test starts. They are drawn below
// the kernel's ephemeral range: the system hands ports from that range to
// every outgoing connection and every listener on port 0, so one free when
// drawn there can be taken by any connection before the process that was
// meant to bind it does. A port below it is only taken by a process that
// names it.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	hi := ephemeralLow()
	if hi-portFloor < 1000 {
		// No room below the ephemeral range: any free port.
		var ports []int
		for range n {
			l, err := net.Listen("tcp", ":0")
			if err != nil {
				return nil, err
			}
			ls = append(ls, l)
			ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		}
		return ports, nil
	}
	tried := map[int]bool{}
	var ports []int
	for len(ports) < n {
		if len(tried) >= 1000 {
			return nil, fmt.Errorf("%d free TCP ports wanted between %d and %d: only %d of %d tried were free", n, portFloor, hi, len(ports), len(tried))
		}
		p := portFloor + rand.IntN(hi-portFloor)
		if tried[p] {
			continue
		}
		tried[p] = true
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux's
// default where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	lo, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return 32768
	}
	return lo
}
