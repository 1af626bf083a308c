// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/extproc"
)

// tlsVersions are --tls-min-version's values: the llm-d router's names,
// which are crypto/tls's constant names (as Kubernetes components take them).
var tlsVersions = map[string]uint16{
	"VersionTLS10": tls.VersionTLS10,
	"VersionTLS11": tls.VersionTLS11,
	"VersionTLS12": tls.VersionTLS12,
	"VersionTLS13": tls.VersionTLS13,
}

// cipherSuites maps --tls-cipher-suites' names to crypto/tls IDs: the IANA
// names crypto/tls reports (secure and insecure ones, as upstream), and
// crypto/tls's constant names of the ChaCha20 suites, which lack the
// IANA _SHA256 (Kubernetes components accept both).
var cipherSuites = func() map[string]uint16 {
	m := map[string]uint16{
		"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305":   tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,
		"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305,
	}
	for _, cs := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		m[cs.Name] = cs.ID
	}
	return m
}()

// bindTLSFlags binds the ext_proc listener's TLS flags to o (beside
// --secure-serving, --cert-path and --enable-cert-reload).
func bindTLSFlags(fs *pflag.FlagSet, o *extproc.Options) {
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile,
		"PEM file of CA certificates: ext_proc clients (gateways) must present a certificate signed by one of them, else the TLS handshake is refused (mutual TLS). Reloaded when it changes with --enable-cert-reload. Needs --secure-serving. Empty: no client certificate is asked for.")
	fs.Var(&tlsVersionValue{p: &o.TLSMinVersion}, "tls-min-version",
		"Lowest TLS version the ext_proc listener (and the metrics port with --metrics-cert-dir) accepts: VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13. Empty: VersionTLS12.")
	fs.Var(&cipherSuitesValue{p: &o.TLSCipherSuites}, "tls-cipher-suites",
		"Comma-separated cipher suites the ext_proc listener (and the metrics port with --metrics-cert-dir) accepts for TLS 1.2 and below (IANA names as Go's crypto/tls spells them, e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256). TLS 1.3's suites are not configurable. Empty: gRPC's default, Go's secure suites less those HTTP/2 forbids, which leaves none for TLS 1.0 and 1.1 (name a CBC suite to accept them).")
}

// completeTLS checks the TLS flags against --secure-serving, and the
// metrics port's as upstream does.
func completeTLS(o *options) error {
	if o.extproc.Insecure && o.extproc.ClientCAFile != "" {
		return errors.New("--client-ca-file needs --secure-serving (it is false): client certificates are a part of TLS")
	}
	if o.observability.metricsClientCAFile != "" && o.observability.metricsCertDir == "" {
		return errors.New("--metrics-client-ca-file needs --metrics-cert-dir: client certificates are a part of TLS")
	}
	if o.observability.metricsCertDir != "" && o.observability.metricsClientCAFile == "" && !o.observability.metricsEndpointAuth {
		return errors.New("--metrics-cert-dir with --metrics-endpoint-auth=false serves metrics over TLS to anyone: set --metrics-client-ca-file or leave --metrics-endpoint-auth on")
	}
	return nil
}

// metricsTLSFrom is the metrics port's TLS the flags ask for; nil: plain HTTP.
func metricsTLSFrom(o *options) *metricsTLS {
	if o.observability.metricsCertDir == "" {
		return nil
	}
	return &metricsTLS{certDir: o.observability.metricsCertDir, clientCAFile: o.observability.metricsClientCAFile,
		minVersion: o.extproc.TLSMinVersion, cipherSuites: o.extproc.TLSCipherSuites}
}

// tlsWarnings names the TLS flags set on the command line that change
// nothing: with --secure-serving=false and no --metrics-cert-dir, or suites
// only TLS 1.3 negotiates (or suites at all under
// --tls-min-version=VersionTLS13).
func tlsWarnings(fs *pflag.FlagSet) []string {
	changed := func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			return "", false
		}
		return f.Value.String(), true
	}
	var out []string
	if secure := fs.Lookup("secure-serving"); secure != nil && secure.Value.String() == "false" {
		if dir, _ := changed("metrics-cert-dir"); dir == "" {
			for _, name := range []string{"tls-min-version", "tls-cipher-suites"} {
				if v, ok := changed(name); ok {
					out = append(out, fmt.Sprintf("--%s=%s has no effect: ext_proc is served in plaintext (--secure-serving=false), and metrics too (no --metrics-cert-dir)", name, v))
				}
			}
			return out
		}
	}
	v, ok := changed("tls-cipher-suites")
	if !ok {
		return nil
	}
	if min, _ := changed("tls-min-version"); min == "VersionTLS13" {
		return []string{fmt.Sprintf("--tls-cipher-suites=%s has no effect: TLS 1.3's suites are not configurable, and --tls-min-version=VersionTLS13 refuses older versions", v)}
	}
	var only13 []string
	for _, cs := range tls.CipherSuites() {
		if strings.Contains(","+v+",", ","+cs.Name+",") && slices.Equal(cs.SupportedVersions, []uint16{tls.VersionTLS13}) {
			only13 = append(only13, cs.Name)
		}
	}
	if len(only13) > 0 {
		out = append(out, fmt.Sprintf("--tls-cipher-suites: %s have no effect: they are TLS 1.3 suites, which are not configurable", strings.Join(only13, ", ")))
	}
	return out
}

// tlsVersionValue is --tls-min-version: a version name, stored as its ID.
type tlsVersionValue struct{ p *uint16 }

func (v *tlsVersionValue) String() string {
	if v == nil || v.p == nil || *v.p == 0 {
		return ""
	}
	for name, id := range tlsVersions {
		if id == *v.p {
			return name
		}
	}
	return fmt.Sprintf("%#04x", *v.p)
}

func (v *tlsVersionValue) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "" {
		*v.p = 0
		return nil
	}
	id, ok := tlsVersions[s]
	if !ok {
		return fmt.Errorf("unknown TLS version %q; the values are VersionTLS10, VersionTLS11, VersionTLS12 and VersionTLS13", s)
	}
	*v.p = id
	return nil
}

func (v *tlsVersionValue) Type() string { return "string" }

// cipherSuitesValue is --tls-cipher-suites: names, stored as IDs in order.
// Repeating the flag adds to the list.
type cipherSuitesValue struct {
	p       *[]uint16
	names   []string
	changed bool
}

func (v *cipherSuitesValue) String() string {
	if v == nil {
		return ""
	}
	return strings.Join(v.names, ",")
}

func (v *cipherSuitesValue) Set(s string) error {
	if !v.changed {
		v.names, *v.p, v.changed = nil, nil, true
	}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		id, ok := cipherSuites[name]
		if !ok {
			return fmt.Errorf("unknown cipher suite %q; the names are %s", name, strings.Join(cipherSuiteNames(), ", "))
		}
		v.names = append(v.names, name)
		*v.p = append(*v.p, id)
	}
	return nil
}

func (v *cipherSuitesValue) Type() string { return "strings" }

// cipherSuiteNames are the secure suites' names, for an error message.
func cipherSuiteNames() []string {
	var names []string
	for _, cs := range tls.CipherSuites() {
		names = append(names, cs.Name)
	}
	sort.Strings(names)
	return names
}
