// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testCA is a certificate authority that signs client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

// client issues a client-authentication certificate, as a gateway presents.
func (ca *testCA) client(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// writeCAFile replaces path with the CAs' PEM bundle the way a Secret or
// ConfigMap volume does (write aside, rename), so a reader never sees half.
func writeCAFile(t *testing.T, path string, cas ...*testCA) {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// routeOver opens an ext_proc stream over its own connection with cfg and
// sends a GET's headers; it returns the destination the picker answered,
// or the error that ended the stream (a refused handshake ends it).
func routeOver(t *testing.T, ts *testServer, cfg *tls.Config) (string, error) {
	t.Helper()
	c, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(c).Process(ctx)
	if err != nil {
		return "", err
	}
	if err := s.Send(reqHeaders(envoyHeaders("GET", "/v1/models"), true)); err != nil {
		_, err = s.Recv() // the stream's real error
		return "", err
	}
	r, err := s.Recv()
	if err != nil {
		return "", err
	}
	return destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()), nil
}

// TestClientCertificates: with a client CA file, the ext_proc listener
// refuses a client without a certificate and one whose certificate another
// CA signed, routes one the CA signed, and honours a rotated CA file on the
// next connection without a restart.
func TestClientCertificates(t *testing.T) {
	old := certReloadInterval
	certReloadInterval = 20 * time.Millisecond
	defer func() { certReloadInterval = old }()
	f := newPools(t, 1, 2)
	first, second := newTestCA(t, "gateway CA"), newTestCA(t, "next gateway CA")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeCAFile(t, caFile, first)
	ts := startServer(t, f.reg, leastInFlight{}, Options{ClientCAFile: caFile, EnableCertReload: true})

	clientOf := func(ca *testCA) *tls.Config {
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
		if ca != nil {
			cfg.Certificates = []tls.Certificate{ca.client(t, "gateway")}
		}
		return cfg
	}
	check := func(name string, cfg *tls.Config, routed bool) {
		t.Helper()
		dest, err := routeOver(t, ts, cfg)
		switch {
		case routed && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case routed:
			checkPool(t, f, dest, 0)
		case err == nil:
			t.Errorf("%s: routed to %s, want the handshake refused", name, dest)
		}
	}
	check("no client certificate", clientOf(nil), false)
	check("a certificate of another CA", clientOf(second), false)
	check("a certificate of the CA", clientOf(first), true)
	// Without TLS 1.3 the refusal comes in the handshake itself.
	tls12 := clientOf(nil)
	tls12.MaxVersion = tls.VersionTLS12
	check("no client certificate, TLS 1.2", tls12, false)

	writeCAFile(t, caFile, second)
	eventually(t, "a certificate of the rotated CA routed", func() bool {
		_, err := routeOver(t, ts, clientOf(second))
		return err == nil
	})
	check("a certificate of the CA rotated out", clientOf(first), false)
	check("a certificate of the rotated CA", clientOf(second), true)

}

// TestClientCAsReload: a reload takes a changed file, reports an unchanged
// one as no change, and keeps the pool read before when the file is broken
// or gone.
func TestClientCAsReload(t *testing.T) {
	first, second := newTestCA(t, "first"), newTestCA(t, "second")
	path := filepath.Join(t.TempDir(), "ca.crt")
	writeCAFile(t, path, first)
	c := &clientCAs{path: path}
	verifies := func(ca *testCA) bool {
		_, err := ca.cert.Verify(x509.VerifyOptions{Roots: c.pool.Load()})
		return err == nil
	}
	for _, step := range []struct {
		name          string
		write         func()
		changed, fail bool
		first, second bool
	}{
		{name: "first read", write: func() {}, changed: true, first: true},
		{name: "unchanged", write: func() {}, first: true},
		{name: "both CAs", write: func() { writeCAFile(t, path, first, second) }, changed: true, first: true, second: true},
		{name: "rotated", write: func() { writeCAFile(t, path, second) }, changed: true, second: true},
		{name: "broken file", write: func() {
			_ = os.WriteFile(path, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600)
		}, fail: true, second: true},
		{name: "file gone", write: func() { _ = os.Remove(path) }, fail: true, second: true},
		{name: "back", write: func() { writeCAFile(t, path, first) }, changed: true, first: true},
	} {
		step.write()
		changed, err := c.reload()
		if (err != nil) != step.fail || changed != step.changed {
			t.Errorf("%s: changed %v, error %v; want changed %v, failure %v", step.name, changed, err, step.changed, step.fail)
		}
		if verifies(first) != step.first || verifies(second) != step.second {
			t.Errorf("%s: pool trusts first %v, second %v; want %v, %v", step.name, verifies(first), verifies(second), step.first, step.second)
		}
	}
}

// TestTLSVersionAndCipherSuites: TLSMinVersion refuses a client that offers
// only older versions, TLSCipherSuites one that offers (at TLS 1.2) only
// suites outside the list, and both accept a client within them.
func TestTLSVersionAndCipherSuites(t *testing.T) {
	f := newPools(t, 1, 1)
	const allowed, excluded = tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305
	for _, c := range []struct {
		name    string
		server  Options
		client  *tls.Config
		want    bool
		version uint16
		suite   uint16
	}{
		{name: "default: TLS 1.1 refused", client: &tls.Config{MaxVersion: tls.VersionTLS11}},
		{name: "default: TLS 1.2 accepted", client: &tls.Config{MaxVersion: tls.VersionTLS12}, want: true, version: tls.VersionTLS12},
		{name: "minimum 1.3: TLS 1.2 refused", server: Options{TLSMinVersion: tls.VersionTLS13}, client: &tls.Config{MaxVersion: tls.VersionTLS12}},
		{name: "minimum 1.3: TLS 1.3 accepted", server: Options{TLSMinVersion: tls.VersionTLS13}, want: true, version: tls.VersionTLS13},
		// TLS 1.0 has only CBC suites, which gRPC leaves out of its
		// default list (HTTP/2's): they must be named.
		{name: "minimum 1.0: TLS 1.0 refused without a CBC suite", server: Options{TLSMinVersion: tls.VersionTLS10}, client: &tls.Config{MaxVersion: tls.VersionTLS10}},
		{name: "minimum 1.0: TLS 1.0 accepted with a CBC suite", server: Options{TLSMinVersion: tls.VersionTLS10, TLSCipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, allowed}},
			client: &tls.Config{MaxVersion: tls.VersionTLS10}, want: true, version: tls.VersionTLS10},
		{name: "suites: an excluded suite refused", server: Options{TLSCipherSuites: []uint16{allowed}},
			client: &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{excluded}}},
		{name: "suites: an allowed suite accepted", server: Options{TLSCipherSuites: []uint16{allowed}},
			client: &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{excluded, allowed}}, want: true, version: tls.VersionTLS12, suite: allowed},
		{name: "suites: TLS 1.3 is not restricted", server: Options{TLSCipherSuites: []uint16{allowed}}, want: true, version: tls.VersionTLS13},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, f.reg, leastInFlight{}, c.server)
			cfg := &tls.Config{}
			if c.client != nil {
				cfg = c.client.Clone()
			}
			cfg.InsecureSkipVerify, cfg.NextProtos, cfg.MinVersion = true, []string{"h2"}, tls.VersionTLS10
			conn, err := tls.Dial("tcp", ts.addr, cfg)
			if !c.want {
				if err == nil {
					conn.Close()
					t.Fatal("handshake accepted")
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake refused: %v", err)
			}
			st := conn.ConnectionState()
			conn.Close()
			if st.Version != c.version || (c.suite != 0 && st.CipherSuite != c.suite) {
				t.Fatalf("negotiated %s with %s, want %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite), tls.VersionName(c.version))
			}
			// And ext_proc works over such a connection (gRPC clients
			// themselves go no lower than TLS 1.2).
			if st.Version < tls.VersionTLS12 {
				return
			}
			cfg.MinVersion = 0
			if dest, err := routeOver(t, ts, cfg); err != nil {
				t.Fatalf("ext_proc over %s: %v", tls.VersionName(st.Version), err)
			} else {
				checkPool(t, f, dest, 0)
			}
		})
	}
}

// TestTLSOptionsRefused: TLS options that cannot work are refused by New,
// and a client CA file that cannot be used fails Start, naming the file.
func TestTLSOptionsRefused(t *testing.T) {
	f := newPools(t, 1, 1)
	for _, c := range []struct {
		name string
		opts Options
		want string
	}{
		{"client CA without TLS", Options{Insecure: true, ClientCAFile: "/ca.crt"}, "needs TLS"},
		{"version below TLS 1.0", Options{TLSMinVersion: 0x0300}, "not TLS 1.0 to 1.3"},
		{"version above TLS 1.3", Options{TLSMinVersion: 0x0305}, "not TLS 1.0 to 1.3"},
		{"unknown cipher suite", Options{TLSCipherSuites: []uint16{0xffff}}, "0xffff"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(f.reg, leastInFlight{}, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error containing %q", err, c.want)
			}
		})
	}
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not-pem.crt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyOnly := filepath.Join(dir, "key-only.pem")
	if err := os.WriteFile(keyOnly, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, file, want string }{
		{"missing file", filepath.Join(dir, "absent.crt"), "absent.crt"},
		{"not PEM", notPEM, "no PEM CERTIFICATE block"},
		{"no certificate in the bundle", keyOnly, "no PEM CERTIFICATE block"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, err := New(f.reg, leastInFlight{}, Options{ClientCAFile: c.file, GRPCListener: mustListen(t), HealthListener: mustListen(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(context.Background()); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start: %v, want an error containing %q", err, c.want)
			}
		})
	}
}
