// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"crypto/tls"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestTLSFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		// parseErr is an error of the flag's own parsing, err one of
		// completeCompat.
		parseErr, err string
		minVersion    uint16
		suites        []uint16
		clientCA      string
		warns         []string
	}{
		{name: "defaults"},
		{name: "the llm-d router's version names", args: []string{"--tls-min-version=VersionTLS13"}, minVersion: tls.VersionTLS13},
		{name: "VersionTLS12", args: []string{"--tls-min-version", "VersionTLS12"}, minVersion: tls.VersionTLS12},
		{name: "empty version is the default", args: []string{"--tls-min-version="}},
		{name: "unknown version", args: []string{"--tls-min-version=1.3"}, parseErr: `unknown TLS version "1.3"; the values are VersionTLS10, VersionTLS11, VersionTLS12 and VersionTLS13`},
		{name: "lower-case version", args: []string{"--tls-min-version=versiontls12"}, parseErr: `unknown TLS version "versiontls12"`},
		{name: "suites in order", args: []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"},
			suites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
		{name: "repeated flag adds", args: []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"},
			suites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
		{name: "ChaCha20 under both names", args: []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"},
			suites: []uint16{tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305}},
		{name: "an insecure suite, as upstream accepts", args: []string{"--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"}, suites: []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA}},
		{name: "unknown suite", args: []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_MADE_UP"}, parseErr: `unknown cipher suite "TLS_MADE_UP"; the names are `},
		{name: "TLS 1.3 suites warn", args: []string{"--tls-cipher-suites=TLS_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
			suites: []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}, warns: []string{"TLS_AES_128_GCM_SHA256 have no effect"}},
		{name: "suites under a TLS 1.3 minimum warn", args: []string{"--tls-min-version=VersionTLS13", "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
			minVersion: tls.VersionTLS13, suites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}, warns: []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 has no effect"}},
		{name: "plaintext: TLS flags warn", args: []string{"--secure-serving=false", "--tls-min-version=VersionTLS13", "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
			minVersion: tls.VersionTLS13, suites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
			warns: []string{"--tls-min-version=VersionTLS13 has no effect: ext_proc is served in plaintext", "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 has no effect: ext_proc is served in plaintext"}},
		{name: "client CA", args: []string{"--client-ca-file=/etc/ca/ca.crt"}, clientCA: "/etc/ca/ca.crt"},
		{name: "client CA without TLS", args: []string{"--client-ca-file=/etc/ca/ca.crt", "--secure-serving=false"}, err: "--client-ca-file needs --secure-serving (it is false)"},
		{name: "metrics client CA without a metrics certificate", args: []string{"--metrics-client-ca-file=/etc/ca/ca.crt"}, err: "--metrics-client-ca-file needs --metrics-cert-dir"},
		{name: "metrics TLS without authentication", args: []string{"--metrics-cert-dir=/etc/metrics", "--metrics-endpoint-auth=false"}, err: "serves metrics over TLS to anyone"},
		{name: "metrics TLS with token authentication", args: []string{"--metrics-cert-dir=/etc/metrics"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			err := fs.Parse(c.args)
			if c.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.parseErr) {
					t.Fatalf("parse error %v, want %q", err, c.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = completeCompat(&o, func(string) string { return "" })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.extproc.TLSMinVersion != c.minVersion || !slices.Equal(o.extproc.TLSCipherSuites, c.suites) || o.extproc.ClientCAFile != c.clientCA {
				t.Errorf("min version %#04x, suites %#04x, client CA %q; want %#04x, %#04x, %q",
					o.extproc.TLSMinVersion, o.extproc.TLSCipherSuites, o.extproc.ClientCAFile, c.minVersion, c.suites, c.clientCA)
			}
			warns := tlsWarnings(fs)
			if len(warns) != len(c.warns) {
				t.Fatalf("warnings %q, want %d: %q", warns, len(c.warns), c.warns)
			}
			for i, w := range c.warns {
				if !strings.Contains(warns[i], w) {
					t.Errorf("warning %q, want one containing %q", warns[i], w)
				}
			}
		})
	}
}

// TestEmitEndpointScoresFlag: the llm-d router's flag reaches the ext_proc
// options, off by default.
func TestEmitEndpointScoresFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"--emit-endpoint-scores"}, true}, {[]string{"--emit-endpoint-scores=false"}, false}} {
		var o options
		if err := newFlagSet(io.Discard, &o).Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if err := completeCompat(&o, func(string) string { return "" }); err != nil {
			t.Fatal(err)
		}
		if o.extproc.EmitEndpointScores != c.want {
			t.Errorf("%v: EmitEndpointScores %v, want %v", c.args, o.extproc.EmitEndpointScores, c.want)
		}
	}
}
