package extproc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"path/filepath"
	"time"

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

// tlsConfig builds the ext_proc port's TLS: TLS 1.2+, ALPN h2 (added by
// grpc's credentials). startWatcher is non-nil when the certificate must be
// watched for changes; it runs until ctx ends.
func (s *Server) tlsConfig() (cfg *tls.Config, startWatcher func(context.Context) error, err error) {
	cfg = &tls.Config{MinVersion: minTLSVersion, NextProtos: []string{"h2"}}
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
		startWatcher = w.Start
	default:
		cert, err := tls.LoadX509KeyPair(filepath.Join(s.opts.CertPath, certFile), filepath.Join(s.opts.CertPath, keyFile))
		if err != nil {
			return nil, nil, fmt.Errorf("extproc: loading certificate from %s: %w", s.opts.CertPath, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, startWatcher, nil
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
