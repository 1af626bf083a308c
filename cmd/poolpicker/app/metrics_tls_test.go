// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/internal/poll"
)

// issue makes a certificate signed by parent (self-signed when nil) and
// returns it with its key.
func issue(t *testing.T, parent *tls.Certificate, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsTLS serves the metrics port with --metrics-cert-dir and
// --metrics-client-ca-file as the flags set them, and scrapes it over real
// HTTPS: a client certificate of the CA gets the page; none, one of another
// CA, a plaintext request, or a TLS version under --tls-min-version do not.
func TestMetricsTLS(t *testing.T) {
	dir := t.TempDir()
	ca := issue(t, nil, &x509.Certificate{Subject: pkix.Name{CommonName: "metrics CA"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign})
	other := issue(t, nil, &x509.Certificate{Subject: pkix.Name{CommonName: "other CA"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign})
	server := issue(t, &ca, &x509.Certificate{Subject: pkix.Name{CommonName: "poolpicker-metrics"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	clientOf := func(parent tls.Certificate) tls.Certificate {
		return issue(t, &parent, &x509.Certificate{Subject: pkix.Name{CommonName: "prometheus"}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	}
	writePEM(t, filepath.Join(dir, "tls.crt"), "CERTIFICATE", server.Certificate[0])
	keyDER, err := x509.MarshalPKCS8PrivateKey(server.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "tls.key"), "PRIVATE KEY", keyDER)
	caFile := filepath.Join(dir, "ca.crt")
	writePEM(t, caFile, "CERTIFICATE", ca.Certificate[0])

	var o options
	if err := newFlagSet(io.Discard, &o).Parse([]string{"--metrics-cert-dir=" + dir, "--metrics-client-ca-file=" + caFile, "--tls-min-version=VersionTLS13"}); err != nil {
		t.Fatal(err)
	}
	if err := completeCompat(&o, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	ms := &metricsServer{addr: addr, gatherer: prometheus.NewRegistry(), tls: metricsTLSFrom(&o), log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ms.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	poll.Until(t, 20*time.Second, "the metrics port listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	roots := x509.NewCertPool()
	roots.AddCert(ca.Leaf)
	get := func(url string, cfg *tls.Config) (int, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, c := range []struct {
		name string
		cfg  *tls.Config
		url  string
		ok   bool
	}{
		{"a client certificate of the CA", &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientOf(ca)}}, "https://" + addr + "/metrics", true},
		{"no client certificate", &tls.Config{RootCAs: roots}, "https://" + addr + "/metrics", false},
		{"a client certificate of another CA", &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientOf(other)}}, "https://" + addr + "/metrics", false},
		{"TLS 1.2 under --tls-min-version=VersionTLS13", &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientOf(ca)}, MaxVersion: tls.VersionTLS12}, "https://" + addr + "/metrics", false},
		{"plain HTTP", nil, "http://" + addr + "/metrics", false},
	} {
		code, err := get(c.url, c.cfg)
		if got := err == nil && code == http.StatusOK; got != c.ok {
			t.Errorf("%s: status %d, error %v; want served %v", c.name, code, err, c.ok)
		}
	}
}
