// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Certificate file names inside Options.CertPath, as in a kubernetes.io/tls Secret.
const (
	certFile = "tls.crt"
	keyFile  = "tls.key"
)

// certReloadInterval is how often the watcher re-reads the files in case a
// change event was missed (Secret volumes update through symlink swaps).
var certReloadInterval = 10 * time.Second

// tlsConfig builds the ext_proc port's TLS: Options.TLSMinVersion (TLS 1.2
// by default) and TLSCipherSuites, ALPN h2 (added by grpc's credentials),
// and with Options.ClientCAFile a verified client certificate. startWatcher
// is non-nil when a file must be watched for changes; it runs until ctx
// ends.
func (s *Server) tlsConfig() (cfg *tls.Config, startWatcher func(context.Context) error, err error) {
	cfg = &tls.Config{MinVersion: cmp.Or(s.opts.TLSMinVersion, minTLSVersion), CipherSuites: s.opts.TLSCipherSuites, NextProtos: []string{"h2"}}
	var watchers []func(context.Context) error
	switch {
	case s.opts.CertPath == "":
		cert, err := selfSignedCertificate(time.Now())
		if err != nil {
			return nil, nil, fmt.Errorf("extproc: making a self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case s.opts.EnableCertReload:
		w, err := certwatcher.New(filepath.Join(s.opts.CertPath, certFile), filepath.Join(s.opts.CertPath, keyFile))
		if err != nil {
			return nil, nil, fmt.Errorf("extproc: loading certificate from %s: %w", s.opts.CertPath, err)
		}
		w = w.WithWatchInterval(certReloadInterval)
		cfg.GetCertificate = w.GetCertificate
		watchers = append(watchers, w.Start)
	default:
		cert, err := tls.LoadX509KeyPair(filepath.Join(s.opts.CertPath, certFile), filepath.Join(s.opts.CertPath, keyFile))
		if err != nil {
			return nil, nil, fmt.Errorf("extproc: loading certificate from %s: %w", s.opts.CertPath, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if s.opts.ClientCAFile != "" {
		cas := &clientCAs{path: s.opts.ClientCAFile, log: s.log.WithName("client-ca")}
		if _, err := cas.reload(); err != nil {
			return nil, nil, err
		}
		// A resumed session skips verification: after a CA rotation a
		// client of the old CA could come back on its ticket.
		cfg.SessionTicketsDisabled = true
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		base := cfg.Clone()
		// Each handshake verifies against the pool read last, so a
		// rotated CA file applies to the next connection.
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.ClientCAs = cas.pool.Load()
			return c, nil
		}
		if s.opts.EnableCertReload {
			watchers = append(watchers, cas.watch)
		}
		s.log.Info("ext_proc clients must present a certificate", "clientCAFile", s.opts.ClientCAFile, "reload", s.opts.EnableCertReload)
	}
	if len(watchers) > 0 {
		// The first watcher to fail stops the others, so that Start
		// learns of it.
		startWatcher = func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			errs := make(chan error, len(watchers))
			for _, w := range watchers {
				go func() { errs <- w(ctx) }()
			}
			var first error
			for range watchers {
				if err := <-errs; err != nil && first == nil {
					first = err
					cancel()
				}
			}
			return first
		}
	}
	return cfg, startWatcher, nil
}

// clientCAs is the CA pool of Options.ClientCAFile, re-read by watch.
type clientCAs struct {
	path string
	log  logr.Logger
	pool atomic.Pointer[x509.CertPool]
	// last is the file content of pool; only reload touches it (once
	// before the listener starts, then from watch's goroutine alone).
	last []byte
}

// reload reads the file and, when its content changed, parses it and puts
// the new pool in use; a file that does not parse leaves the old pool.
func (c *clientCAs) reload() (changed bool, err error) {
	data, err := os.ReadFile(c.path)
	if err != nil {
		return false, fmt.Errorf("extproc: reading the client CA file %s: %w", c.path, err)
	}
	if c.last != nil && bytes.Equal(data, c.last) {
		return false, nil
	}
	pool, err := parseCAs(data)
	if err != nil {
		return false, fmt.Errorf("extproc: client CA file %s: %w", c.path, err)
	}
	c.pool.Store(pool)
	c.last = data
	return true, nil
}

// watch re-reads the file every certReloadInterval until ctx ends. Secret
// and ConfigMap volumes update through symlink swaps, which a poll of the
// content sees whatever the file system's events say.
func (c *clientCAs) watch(ctx context.Context) error {
	t := time.NewTicker(certReloadInterval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		changed, err := c.reload()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				c.log.Error(err, "keeping the client CAs read before")
			}
			lastErr = err.Error()
		case changed:
			lastErr = ""
			c.log.Info("client CA file reloaded", "path", c.path)
		}
	}
}

// parseCAs reads every CERTIFICATE block of a PEM bundle; other blocks are
// skipped, and a bundle without a certificate is an error (a client CA
// pool that is empty would refuse every gateway).
func parseCAs(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, errors.New("no PEM CERTIFICATE block in it")
	}
	return pool, nil
}

// selfSignedCertificate makes a throwaway ECDSA P-256 certificate valid for
// ten years: gateways encrypt to the EPP but do not verify it by default.
func selfSignedCertificate(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"poolpicker"}, CommonName: "poolpicker-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Validate reports an option that cannot work: today the TLS ones (a
// client CA without TLS, a TLS version or cipher suite crypto/tls does not
// implement); the numeric limits' zero and negative values all mean
// something. New calls it; a command calls it first, to refuse bad flags
// before anything is built.
func (o Options) Validate() error {
	if o.Insecure && o.ClientCAFile != "" {
		return errors.New("extproc: a client CA file needs TLS on the ext_proc port (it is off)")
	}
	if v := o.TLSMinVersion; v != 0 && (v < tls.VersionTLS10 || v > tls.VersionTLS13) {
		return fmt.Errorf("extproc: TLS minimum version %#04x is not TLS 1.0 to 1.3", v)
	}
	known := map[uint16]bool{}
	for _, cs := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		known[cs.ID] = true
	}
	for _, id := range o.TLSCipherSuites {
		if !known[id] {
			return fmt.Errorf("extproc: cipher suite %#04x is not one crypto/tls implements", id)
		}
	}
	return nil
}

// CertificateTLSConfig is a server TLS configuration with the ext_proc
// listener's certificate (CertPath's, read once, or a self-signed one),
// minimum version and cipher suites, and no client certificates: for
// another listener of the process with the same posture (peer sync).
func (o Options) CertificateTLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: cmp.Or(o.TLSMinVersion, minTLSVersion), CipherSuites: o.TLSCipherSuites, NextProtos: []string{"h2"}}
	var cert tls.Certificate
	var err error
	if o.CertPath == "" {
		cert, err = selfSignedCertificate(time.Now())
	} else {
		cert, err = tls.LoadX509KeyPair(filepath.Join(o.CertPath, certFile), filepath.Join(o.CertPath, keyFile))
	}
	if err != nil {
		return nil, fmt.Errorf("extproc: certificate: %w", err)
	}
	cfg.Certificates = []tls.Certificate{cert}
	return cfg, nil
}
