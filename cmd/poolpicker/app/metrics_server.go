// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/poolpicker/poolpicker/internal/debugview"
)

// metricsServer serves /metrics, /debug/pools (and with pprof
// /debug/pprof/) until its context is cancelled, every path behind filter
// when it is set.
type metricsServer struct {
	addr     string
	gatherer prometheus.Gatherer
	// pprof serves Go's profiles (--enable-pprof).
	pprof bool
	// debug serves the pools, endpoints and recent decisions at
	// debugview.Path. Nil: not served.
	debug http.Handler
	// filter authenticates and authorizes each request
	// (--metrics-endpoint-auth). Nil: none.
	filter metricsserver.Filter
	// tls, when set, serves HTTPS (--metrics-cert-dir). Nil: plain HTTP.
	tls *metricsTLS
	log logr.Logger
}

// metricsTLS is the metrics port's TLS, as the llm-d router's flags set
// it: a certificate directory (tls.crt, tls.key; reloaded when the files
// change, as controller-runtime's metrics server does), an optional CA whose
// client certificates are required, and the ext_proc listener's version
// floor and suites (--tls-min-version, --tls-cipher-suites).
type metricsTLS struct {
	certDir      string
	clientCAFile string
	minVersion   uint16
	cipherSuites []uint16
}

// config builds the listener's TLS; the certificate watcher runs until ctx
// ends.
func (t *metricsTLS) config(ctx context.Context, log logr.Logger) (*tls.Config, error) {
	w, err := certwatcher.New(filepath.Join(t.certDir, "tls.crt"), filepath.Join(t.certDir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("metrics server: loading the certificate of --metrics-cert-dir %s: %w", t.certDir, err)
	}
	go func() {
		if err := w.Start(ctx); err != nil {
			log.Error(err, "metrics certificate watcher stopped")
		}
	}()
	cfg := &tls.Config{MinVersion: cmp.Or(t.minVersion, tls.VersionTLS12), CipherSuites: t.cipherSuites,
		GetCertificate: w.GetCertificate, NextProtos: []string{"http/1.1"}}
	if t.clientCAFile != "" {
		pem, err := os.ReadFile(t.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("metrics server: reading --metrics-client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("metrics server: --metrics-client-ca-file %s holds no PEM certificate", t.clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// metricsAuthFilter is controller-runtime's metrics filter, as upstream's
// EPP uses it: the bearer token is authenticated with a TokenReview and the
// request (verb from the method, the path as a non-resource URL, so get on
// /metrics) authorized with a SubjectAccessReview, answers cached (tokens
// 1m, allowed 5m, denied 30s). No token or an invalid one is 401, a token
// without the permission 403.
func metricsAuthFilter(cfg *rest.Config) (metricsserver.Filter, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint authentication: %w", err)
	}
	f, err := filters.WithAuthenticationAndAuthorization(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint authentication: %w", err)
	}
	return f, nil
}

func (s *metricsServer) handler() (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	if s.debug != nil {
		mux.Handle(debugview.Path, s.debug)
	}
	if s.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if s.filter == nil {
		return mux, nil
	}
	h, err := s.filter(s.log.WithName("metrics-auth"), mux)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint authentication: %w", err)
	}
	return h, nil
}

func (s *metricsServer) Start(ctx context.Context) error {
	h, err := s.handler()
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	if s.tls != nil {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		cfg, err := s.tls.config(watchCtx, s.log)
		if err != nil {
			lis.Close()
			return err
		}
		lis = tls.NewListener(lis, cfg)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	<-errc
	return nil
}
