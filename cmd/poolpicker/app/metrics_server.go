package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// metricsServer serves /metrics (and with pprof /debug/pprof/) until its
// context is cancelled, every path behind filter when it is set.
type metricsServer struct {
	addr     string
	gatherer prometheus.Gatherer
	// pprof serves Go's profiles (--enable-pprof).
	pprof bool
	// filter authenticates and authorizes each request
	// (--metrics-endpoint-auth). Nil: none.
	filter metricsserver.Filter
	log    logr.Logger
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
