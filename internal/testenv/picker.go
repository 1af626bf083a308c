// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package testenv

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// RSS is a process's resident set size, from /proc/PID/status: what the
// suites that run the built picker hold against the chart's memory limit.
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// MetricSum reads the Prometheus page at url and sums the gauge and
// counter series of the family name whose labels include match (nil:
// every series).
func MetricSum(c *http.Client, url, name string, match map[string]string) (float64, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", url, err)
	}
	var sum float64
series:
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if labels[k] != v {
				continue series
			}
		}
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return sum, nil
}

// PickerConns keeps one gRPC connection to a picker per address and
// :authority (grpc-go takes no per-call authority over TLS), as a gateway
// keeps one per picker Service endpoint. The zero value is ready.
type PickerConns struct {
	// MaxMsgBytes bounds the messages sent and received (zero: grpc-go's
	// defaults).
	MaxMsgBytes int

	mu sync.Mutex
	m  map[string]*grpc.ClientConn
}

// Get returns the connection to the picker at addr for authority, made
// on first use.
func (c *PickerConns) Get(addr, authority string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := addr + "/" + authority
	if cc, ok := c.m[key]; ok {
		return cc, nil
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})), // the picker's certificate is self-signed, as gateways accept
		grpc.WithAuthority(authority),
	}
	if c.MaxMsgBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.MaxMsgBytes), grpc.MaxCallSendMsgSize(c.MaxMsgBytes)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*grpc.ClientConn{}
	}
	c.m[key] = cc
	return cc, nil
}

// Close closes every connection.
func (c *PickerConns) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cc := range c.m {
		cc.Close()
		delete(c.m, k)
	}
}
