// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/requestcontrol"
)

// Scheduler picks endpoints for a request in a pool; *scheduling.Scheduler
// satisfies it. The request controller (package requestcontrol) is its one
// caller.
type Scheduler = requestcontrol.Scheduler

// Health service names served on the health port. Liveness is SERVING while
// the process runs; the others follow readiness (Ready, and NOT_SERVING once
// draining). Upstream's probes ask HealthInferenceExtension (its chart and
// the conformance manifests, for both probes of a single replica) and the
// empty name (load balancers' overall health); both mean ready there too.
const (
	HealthLiveness           = "liveness"
	HealthReadiness          = "readiness"
	HealthExtProc            = "envoy.service.ext_proc.v3.ExternalProcessor"
	HealthInferenceExtension = "inference-extension"
	HealthOverall            = ""
)

// readinessServices are the health services whose status is readiness.
var readinessServices = []string{HealthReadiness, HealthExtProc, HealthInferenceExtension, HealthOverall}

// Server is the ext_proc server and its health server, a runnable.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	opts    Options
	reg     *datastore.Registry
	metrics *metrics
	limits  *limits
	log     logr.Logger
	health  *health.Server
	streams sync.WaitGroup
	// draining is set when Start's context ends: readiness is NOT_SERVING
	// from then on, whatever the pools say.
	draining atomic.Bool
	// requests runs each request's life once the stream has read it:
	// admission, scheduling, in-flight accounting.
	requests *requestcontrol.Controller
	// promptLimit is the most prompt bytes the scheduler reads
	// (PromptBytes); the body parser validates no more (it skims the rest).
	promptLimit int
	// flowHeader is FlowControl's flow header (lower case), read with the
	// request headers; empty when none.
	flowHeader string
}

// New returns a server answering for the pools in reg with sched's picks.
func New(reg *datastore.Registry, sched Scheduler, opts Options) (*Server, error) {
	if reg == nil || sched == nil {
		return nil, errors.New("extproc: registry and scheduler are required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	m, err := newMetrics(opts.Registerer, reg, opts.MaxModelLabels, opts.FairShareReservePercent)
	if err != nil {
		return nil, fmt.Errorf("extproc: registering metrics: %w", err)
	}
	l, err := newLimits(opts.Registerer, &opts)
	if err != nil {
		return nil, fmt.Errorf("extproc: registering metrics: %w", err)
	}
	// Series of pools and endpoints that go are deleted with them.
	reg.AddObserver(m)
	reg.AddObserver(l)
	rc, err := requestcontrol.New(sched, requestcontrol.Options{FlowControl: opts.FlowControl})
	if err != nil {
		return nil, err
	}
	return &Server{opts: opts, reg: reg, requests: rc, metrics: m, limits: l, log: opts.Logger,
		health: health.NewServer(), promptLimit: rc.PromptBytes(), flowHeader: rc.FlowHeader()}, nil
}

// Ready reports readiness as served on the health port. With
// Options.PoolsSynced (the pool controller's initial sync) it is that alone:
// one pool whose pods cannot be listed must not take a shared picker out of
// every gateway; that pool's requests are refused on their own (503
// PoolNotSynced). Without it, at least one pool is served and every served
// pool is synced. Once draining, it is false.
func (s *Server) Ready() bool {
	if s.draining.Load() {
		return false
	}
	if s.opts.PoolsSynced != nil {
		return s.opts.PoolsSynced()
	}
	return s.reg.Len() > 0 && s.reg.AllSynced()
}

// Start serves ext_proc and health until ctx is cancelled, then drains:
// health turns NOT_SERVING, new streams are still accepted for
// DrainGracePeriod (gateways and Service endpoints take a while to notice),
// then the listener closes, open streams get DrainTimeout to finish, and
// whatever is left is cut (their accounting finishes as cancelled).
func (s *Server) Start(ctx context.Context) error {
	lis, err := s.listen(s.opts.GRPCListener, s.opts.GRPCPort)
	if err != nil {
		return err
	}
	hlis, err := s.listen(s.opts.HealthListener, s.opts.HealthPort)
	if err != nil {
		lis.Close()
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serverOpts := []grpc.ServerOption{
		// Gateways keep long-lived connections; let idle ones be probed
		// rather than silently dropped by middleboxes.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// A gateway streams a request body as it arrives; with gRPC's
		// 64 KiB default window it stalls on every body near that size until
		// a window update comes back. A stream may send 1 MiB unasked, a
		// connection 16 MiB (the default body limit).
		grpc.InitialWindowSize(streamWindowBytes), grpc.InitialConnWindowSize(connWindowBytes),
		grpc.MaxRecvMsgSize(s.opts.MaxRecvMsgBytes),
		grpc.ChainUnaryInterceptor(s.unaryRecovery), grpc.ChainStreamInterceptor(s.streamRecovery),
		// Every request is a new stream. A pool of workers, one per core,
		// serves new streams on goroutines whose stacks have already grown,
		// instead of a new goroutine per stream; grpc starts a goroutine
		// only when every worker is busy.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	if !s.opts.Insecure {
		cfg, startWatcher, err := s.tlsConfig()
		if err != nil {
			lis.Close()
			hlis.Close()
			return err
		}
		if startWatcher != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := startWatcher(ctx); err != nil {
					errs <- fmt.Errorf("extproc: certificate watcher: %w", err)
				}
			}()
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(serverOpts...)
	extprocv3.RegisterExternalProcessorServer(gs, s)
	if s.opts.HealthOnGRPCPort {
		healthpb.RegisterHealthServer(gs, s.health)
	}
	hs := grpc.NewServer(grpc.ChainUnaryInterceptor(s.unaryRecovery), grpc.ChainStreamInterceptor(s.streamRecovery))
	healthpb.RegisterHealthServer(hs, s.health)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.updateReadiness()

	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := gs.Serve(lis); err != nil {
			errs <- fmt.Errorf("extproc: serving ext_proc: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := hs.Serve(hlis); err != nil {
			errs <- fmt.Errorf("extproc: serving health: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.opts.HealthInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.updateReadiness()
			}
		}
	}()
	s.log.Info("ext_proc server started", "address", lis.Addr().String(), "healthAddress", hlis.Addr().String(), "tls", !s.opts.Insecure)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	cancel()
	s.draining.Store(true)
	s.updateReadiness()
	if serveErr == nil && s.opts.DrainGracePeriod > 0 {
		s.log.Info("draining: readiness NOT_SERVING, still accepting streams", "gracePeriod", s.opts.DrainGracePeriod.String())
		grace := time.NewTimer(s.opts.DrainGracePeriod)
		select {
		case <-grace.C:
		case serveErr = <-errs:
			grace.Stop()
		}
	}
	s.drain(gs)
	s.health.Shutdown()
	hs.Stop()
	wg.Wait()
	s.streams.Wait()
	return serveErr
}

// drain stops taking streams and waits up to DrainTimeout for open ones.
func (s *Server) drain(gs *grpc.Server) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(s.opts.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
		s.log.Info("ext_proc server drained")
	case <-timer.C:
		s.log.Info("drain timeout reached; cutting open streams", "timeout", s.opts.DrainTimeout.String())
		gs.Stop()
		<-done
	}
}

func (s *Server) updateReadiness() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.Ready() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.setReadiness(st)
}

func (s *Server) setReadiness(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range readinessServices {
		s.health.SetServingStatus(name, st)
	}
}

func (s *Server) listen(l net.Listener, port int) (net.Listener, error) {
	if l != nil {
		return l, nil
	}
	addr := net.JoinHostPort(s.opts.BindAddress, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("extproc: listening on %s: %w", addr, err)
	}
	return l, nil
}

// minTLSVersion is TLS 1.2: gateways in the field still negotiate it.
const minTLSVersion = tls.VersionTLS12

// Flow-control windows the server grants gateways (see Start).
const (
	streamWindowBytes = 1 << 20
	connWindowBytes   = 16 << 20
)
