// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

// Response headers the gateway adds for people and tests (Envoy does not).
const (
	// HeaderServedEndpoint names the endpoint that served the request.
	HeaderServedEndpoint = "x-devgateway-endpoint"
	// HeaderPool names the InferencePool the route chose.
	HeaderPool = "x-devgateway-pool"
	// HeaderExtProcAttempts, present when the picker had to be retried,
	// counts the attempts the request's ext_proc request phase took.
	HeaderExtProcAttempts = "x-devgateway-extproc-attempts"
	// HeaderPicker names the picker address (ip:port) whose stream decided
	// the request, so that a test can tell replicas apart.
	HeaderPicker = "x-devgateway-picker"
)

// Gateway is the development gateway. Create it with New and run it with
// Start.
type Gateway struct {
	opts   Options
	cfg    *rest.Config
	scheme *runtime.Scheme
	log    logr.Logger

	table atomic.Pointer[table]
	conns eppConns
	// objects is the cache of routes, pools and, with
	// ResolveThroughEndpointSlices, picker Services and EndpointSlices; set
	// by Start before serving.
	objects cache.Cache
	// rr spreads requests over a picker Service's replicas.
	rr       atomic.Uint64
	upstream *http.Transport
	h2c      *http.Transport
	// direct reads pods for FailOpen pools, which is rare enough not to
	// warrant a pod cache.
	direct client.Client

	ready chan struct{}
	addr  atomic.Pointer[string]
	// health is the picker's readiness, nil without EPPHealthAddress.
	health *readiness

	mu      sync.Mutex
	stats   Stats
	outages map[string]*Outage
}

// Stats count what the gateway did since it started.
type Stats struct {
	// Requests is the number of requests received.
	Requests int
	// ByStatus counts responses by the status sent to clients.
	ByStatus map[int]int
	// Picks counts the picker's primary endpoint per decision, whether or
	// not the endpoint then took the connection.
	Picks map[string]int
	// ImmediateResponses counts requests the picker answered itself.
	ImmediateResponses int
	// ExtProcRetried counts requests whose ext_proc request phase needed
	// more than one attempt because the picker was unreachable.
	ExtProcRetried int
	// ExtProcGaveUp counts requests that found the picker unreachable for
	// the whole retry window.
	ExtProcGaveUp int
	// Fallbacks counts requests served by a later endpoint of the picker's
	// list after a connect failure.
	Fallbacks int
	// UpstreamFailures counts requests for which no returned endpoint
	// accepted a connection.
	UpstreamFailures int
	// ResponsePhaseLost counts requests whose ext_proc stream broke after
	// the decision; their responses were passed through unprocessed.
	ResponsePhaseLost int
	// DestinationMismatches counts decisions whose header and envoy.lb
	// metadata named different endpoints.
	DestinationMismatches int
	// Outages are the periods a picker address was unreachable, from the
	// first failed attempt to the next successful one (End zero: ongoing).
	Outages []Outage
}

// Outage is a period during which a picker address was unreachable.
type Outage struct {
	// EPP is the picker address (host:port).
	EPP        string
	Start, End time.Time
	// Retried counts requests that waited through the outage and went on
	// to be decided; GaveUp counts those that hit the retry window.
	Retried, GaveUp int
}

// Duration is how long the outage lasted (so far, when ongoing).
func (o Outage) Duration() time.Duration {
	if o.End.IsZero() {
		return time.Since(o.Start)
	}
	return o.End.Sub(o.Start)
}

// New builds a gateway that reads HTTPRoutes and InferencePools through cfg.
func New(cfg *rest.Config, opts Options) (*Gateway, error) {
	opts.setDefaults()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.AddToScheme, gwv1.Install} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("devgateway: client: %w", err)
	}
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}
	g := &Gateway{
		opts:   opts,
		cfg:    cfg,
		scheme: scheme,
		log:    opts.Logger,
		conns:  eppConns{plaintext: opts.EPPPlaintext},
		upstream: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		direct:  direct,
		ready:   make(chan struct{}),
		stats:   Stats{ByStatus: map[int]int{}, Picks: map[string]int{}},
		outages: map[string]*Outage{},
	}
	if opts.EPPHealthAddress != "" {
		g.health = newReadiness(opts.EPPHealthAddress, func(ready bool) {
			g.log.Info("endpoint picker readiness changed", "health", opts.EPPHealthAddress, "ready", ready)
		})
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	g.h2c = &http.Transport{DialContext: dialer.DialContext, Protocols: &protos, DisableCompression: true}
	return g, nil
}

// Ready is closed once the gateway listens and has loaded its routes.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Addr is the listening address, valid once Ready is closed.
func (g *Gateway) Addr() string {
	if p := g.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// Stats returns a copy of the gateway's counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.ByStatus = make(map[int]int, len(g.stats.ByStatus))
	for k, v := range g.stats.ByStatus {
		s.ByStatus[k] = v
	}
	s.Picks = make(map[string]int, len(g.stats.Picks))
	for k, v := range g.stats.Picks {
		s.Picks[k] = v
	}
	s.Outages = append([]Outage(nil), g.stats.Outages...)
	for _, o := range g.outages {
		s.Outages = append(s.Outages, *o)
	}
	return s
}

// Start watches routes and serves HTTP until ctx ends, then shuts down:
// requests in progress get a few seconds to finish.
func (g *Gateway) Start(ctx context.Context) error {
	ln := g.opts.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", g.opts.Addr); err != nil {
			return fmt.Errorf("devgateway: listen on %s: %w", g.opts.Addr, err)
		}
	}
	addr := ln.Addr().String()
	g.addr.Store(&addr)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := cache.New(g.cfg, cache.Options{Scheme: g.scheme})
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("devgateway: cache: %w", err)
	}
	g.objects = c
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	if g.health != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.health.run(ctx)
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := c.Start(ctx); err != nil {
			errc <- fmt.Errorf("devgateway: cache: %w", err)
		}
	}()
	routesReady := make(chan struct{})
	go func() {
		defer wg.Done()
		if err := g.watchRoutes(ctx, c, routesReady); err != nil {
			errc <- err
		}
	}()

	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("devgateway: serve: %w", err)
		}
	}()
	select {
	case <-routesReady:
		if g.health != nil {
			// Give the health watch a moment to learn the picker's state,
			// so that the first requests do not wait on a default.
			g.awaitHealth(ctx, connectWait)
		}
		g.log.Info("development gateway ready", "addr", addr)
		close(g.ready)
	case err = <-errc:
	case <-ctx.Done():
	}
	if err == nil {
		select {
		case err = <-errc:
		case <-ctx.Done():
		}
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	_ = srv.Shutdown(shutdownCtx)
	_ = srv.Close()
	<-served
	cancel()
	wg.Wait()
	g.conns.close()
	g.upstream.CloseIdleConnections()
	g.h2c.CloseIdleConnections()
	return err
}

// countStatus records the status sent to a client.
func (g *Gateway) countStatus(code int) {
	g.mu.Lock()
	g.stats.ByStatus[code]++
	g.mu.Unlock()
}

func (g *Gateway) count(f func(*Stats)) {
	g.mu.Lock()
	f(&g.stats)
	g.mu.Unlock()
}

// localError answers the client from the gateway itself, in the OpenAI error
// shape the picker uses too.
func (g *Gateway) localError(w http.ResponseWriter, code int, msg string) {
	var b struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	b.Error.Message, b.Error.Type, b.Error.Code = msg, "gateway_error", code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&b)
	g.countStatus(code)
}

var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ServeHTTP routes one request: HTTPRoute match → InferencePool → ext_proc
// decision → upstream endpoint, and streams the response back through
// ext_proc.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.count(func(s *Stats) { s.Requests++ })
	t := g.table.Load()
	if t == nil {
		g.localError(w, http.StatusServiceUnavailable, "routes not loaded yet")
		return
	}
	entry, pool, rerr := t.route(r)
	if rerr != nil {
		g.localError(w, rerr.code, rerr.msg)
		return
	}
	w.Header().Set(HeaderPool, pool.key.String())
	ctx := r.Context()
	if entry.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, entry.timeout)
		defer cancel()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(g.opts.MaxRequestBodyBytes)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			g.localError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than the gateway's %d bytes", g.opts.MaxRequestBodyBytes))
			return
		}
		g.localError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	headers := r.Header.Clone()
	for _, h := range hopByHop {
		headers.Del(h)
	}
	if m := entry.headerMod; m != nil {
		for _, h := range m.Set {
			headers.Set(string(h.Name), h.Value)
		}
		for _, h := range m.Add {
			headers.Add(string(h.Name), h.Value)
		}
		for _, h := range m.Remove {
			headers.Del(h)
		}
	}
	if headers.Get(headerRequestID) == "" {
		headers.Set(headerRequestID, newRequestID())
	}
	if len(body) > 0 || r.ContentLength == 0 && r.Method != http.MethodGet && r.Method != http.MethodHead {
		headers.Set(headerContentLength, fmt.Sprint(len(body)))
	}
	log := g.log.WithValues("pool", pool.key.String(), "request", headers.Get(headerRequestID))

	ex, d, attempts, eppAddr, err := g.requestPhase(ctx, pool, r, headers, r.URL.RequestURI(), body)
	if attempts > 1 {
		w.Header().Set(HeaderExtProcAttempts, fmt.Sprint(attempts))
	}
	if err != nil {
		if ctx.Err() != nil && r.Context().Err() != nil {
			return // the client went away
		}
		if pool.failOpen {
			log.V(2).Info("picker unreachable; failing open", "err", err.Error())
			g.failOpen(ctx, w, r, pool, headers, body)
			return
		}
		log.Info("ext_proc failed", "epp", eppAddr, "authority", pool.authority, "attempts", attempts, "err", err.Error())
		g.localError(w, http.StatusServiceUnavailable, fmt.Sprintf("endpoint picker %s (%s) unavailable after %d attempts: %v", pool.authority, eppAddr, attempts, status.Convert(err).Message()))
		return
	}
	w.Header().Set(HeaderPicker, eppAddr)
	if d.immediate != nil {
		g.count(func(s *Stats) { s.ImmediateResponses++ })
		g.writeImmediate(w, d.immediate)
		return
	}
	defer ex.close()
	if d.mismatch != "" {
		g.count(func(s *Stats) { s.DestinationMismatches++ })
		log.Info("picker's destination header and metadata differ", "detail", d.mismatch)
	}
	if len(d.endpoints) == 0 {
		g.localError(w, http.StatusServiceUnavailable, "the endpoint picker returned no destination ("+HeaderDestination+" unset)")
		return
	}
	g.count(func(s *Stats) { s.Picks[d.endpoints[0]]++ })
	path := r.URL.RequestURI()
	if d.path != "" {
		path = d.path
	}
	resp, served, err := g.dial(ctx, pool, d.endpoints, r.Method, path, r.Host, d.headers, d.body)
	if err != nil {
		g.count(func(s *Stats) { s.UpstreamFailures++ })
		log.Info("no endpoint reachable", "endpoints", d.endpoints, "err", err.Error())
		g.localError(w, http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if served != d.endpoints[0] {
		g.count(func(s *Stats) { s.Fallbacks++ })
	}
	log.V(4).Info("proxied", "endpoint", served)
	g.respond(ctx, w, ex, resp, served, log)
}

func (g *Gateway) writeImmediate(w http.ResponseWriter, ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if code == 0 {
		code = http.StatusOK
	}
	applyHeaderMutation(w.Header(), ir.GetHeaders())
	w.WriteHeader(code)
	_, _ = w.Write(ir.GetBody())
	g.countStatus(code)
}

// requestPhase runs the ext_proc request phase, retrying while the picker is
// unreachable for up to the retry window. It returns how many attempts it
// made.
func (g *Gateway) requestPhase(ctx context.Context, pool *poolTarget, r *http.Request, headers http.Header, path string, body []byte) (*exchange, *decision, int, string, error) {
	window := g.opts.ExtProcRetryWindow
	var deadline time.Time
	var outage *Outage
	delay := 25 * time.Millisecond
	// Successive requests start on successive replicas; a failed attempt
	// moves on to the next one (Envoy's round robin and retry on another
	// host).
	start := int(g.rr.Add(1))
	for attempt := 1; ; attempt++ {
		addr, err := g.pickerAddr(pool, start+attempt-1)
		var ex *exchange
		var d *decision
		if err == nil {
			var cc *grpc.ClientConn
			if cc, err = g.conns.get(addr, pool.authority); err != nil {
				return nil, nil, attempt, addr, err
			}
			err = g.waitReady(ctx, cc, deadline)
			if err == nil {
				ex, d, err = g.open(ctx, extprocv3.NewExternalProcessorClient(cc), r, headers, path, body)
			}
		}
		if err == nil {
			g.reachable(g.outageKey(pool, addr))
			return ex, d, attempt, addr, nil
		}
		if ctx.Err() != nil {
			return nil, nil, attempt, addr, ctx.Err()
		}
		if !retryable(err) && !errors.Is(err, errNotReady) {
			return nil, nil, attempt, addr, err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(window)
			outage = g.unreachable(g.outageKey(pool, addr), now)
		}
		if window < 0 || !now.Before(deadline) {
			g.gaveUp(outage)
			return nil, nil, attempt, addr, err
		}
		g.log.V(4).Info("picker unreachable; retrying", "pool", pool.key.String(), "epp", addr, "attempt", attempt, "err", err.Error())
		if g.opts.ResolveThroughEndpointSlices && attempt%2 == 1 {
			continue // straight on to the next replica, then pause
		}
		select {
		case <-time.After(min(delay, time.Until(deadline))):
		case <-ctx.Done():
			return nil, nil, attempt, addr, ctx.Err()
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

var errNotReady = errors.New("ext_proc connection not ready")

// connectWait bounds how long one attempt waits for a connection that is
// still being established.
const connectWait = time.Second

// waitReady waits until the picker is Ready (EPPHealthAddress) and cc is
// connected. A connection in transient failure (the picker refused it)
// fails the attempt at once, so the caller records the outage and retries;
// an unready picker or a connection still being established gets
// connectWait, or until deadline when that is sooner.
func (g *Gateway) waitReady(ctx context.Context, cc *grpc.ClientConn, deadline time.Time) error {
	until := time.Now().Add(connectWait)
	if !deadline.IsZero() && deadline.Before(until) {
		until = deadline
	}
	if g.health != nil {
		for {
			ready, changed := g.health.state()
			if ready {
				break
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(until)):
				return fmt.Errorf("%w (picker not ready on %s)", errNotReady, g.opts.EPPHealthAddress)
			}
		}
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	cc.Connect()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errors.New("ext_proc connection shut down")
		case connectivity.TransientFailure:
			return fmt.Errorf("%w (state %s)", errNotReady, s)
		}
		if !cc.WaitForStateChange(wctx, s) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w (state %s)", errNotReady, s)
		}
	}
}

// awaitHealth waits up to d for the picker to report Ready.
func (g *Gateway) awaitHealth(ctx context.Context, d time.Duration) {
	timeout := time.After(d)
	for {
		ready, changed := g.health.state()
		if ready {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// unreachable records a failed attempt on addr: it opens an outage unless one
// is open, and returns it.
func (g *Gateway) unreachable(addr string, at time.Time) *Outage {
	g.mu.Lock()
	defer g.mu.Unlock()
	o, ok := g.outages[addr]
	if !ok {
		o = &Outage{EPP: addr, Start: at}
		g.outages[addr] = o
		g.log.Info("endpoint picker unreachable; holding requests", "epp", addr, "retryWindow", g.opts.ExtProcRetryWindow.String())
	}
	g.stats.ExtProcRetried++
	o.Retried++
	return o
}

// reachable closes addr's outage, if one is open, on a successful stream.
func (g *Gateway) reachable(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	o, ok := g.outages[addr]
	if !ok {
		return
	}
	o.End = time.Now()
	delete(g.outages, addr)
	g.stats.Outages = append(g.stats.Outages, *o)
	g.log.Info("endpoint picker reachable again", "epp", addr, "unavailableFor", o.End.Sub(o.Start).String(), "requestsHeld", o.Retried, "requestsFailed", o.GaveUp)
}

func (g *Gateway) gaveUp(o *Outage) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.ExtProcGaveUp++
	if o != nil {
		o.GaveUp++
		for i := range g.stats.Outages {
			// The outage may have closed meanwhile; count it where it is.
			if g.stats.Outages[i].Start.Equal(o.Start) && g.stats.Outages[i].EPP == o.EPP {
				g.stats.Outages[i].GaveUp++
			}
		}
	}
}

// upstreamRequest builds the request to one endpoint.
func upstreamRequest(ctx context.Context, method, endpoint, path, host string, h http.Header, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+endpoint+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = h.Clone()
	req.Header.Del(headerContentLength)
	req.ContentLength = int64(len(body))
	if len(body) == 0 {
		req.Body = http.NoBody
	}
	req.Host = host
	return req, nil
}

// dial sends the request to the first endpoint that accepts a connection, in
// order, as Envoy's retry on connect-failure does.
func (g *Gateway) dial(ctx context.Context, pool *poolTarget, endpoints []string, method, path, host string, h http.Header, body []byte) (*http.Response, string, error) {
	tr := g.upstream
	if pool.h2c {
		tr = g.h2c
	}
	var errs []error
	for _, ep := range endpoints {
		req, err := upstreamRequest(ctx, method, ep, path, host, h, body)
		if err != nil {
			return nil, "", fmt.Errorf("request to %s: %w", ep, err)
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			return resp, ep, nil
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
		if !connectFailure(err) {
			break
		}
	}
	return nil, "", errors.Join(errs...)
}

// connectFailure reports whether err means the endpoint never took the
// request: the connection was refused or timed out, or a kept-alive
// connection turned out dead before the request was written.
func connectFailure(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)
}

// failOpen sends the request, unprocessed, to a random ready endpoint of the
// pool, as a gateway does for a FailOpen pool whose picker is down.
func (g *Gateway) failOpen(ctx context.Context, w http.ResponseWriter, r *http.Request, pool *poolTarget, headers http.Header, body []byte) {
	sel, err := g.poolSelector(ctx, pool)
	if err != nil {
		g.localError(w, http.StatusServiceUnavailable, "fail-open: "+err.Error())
		return
	}
	var pods corev1.PodList
	if err := g.direct.List(ctx, &pods, client.InNamespace(pool.key.Namespace), client.MatchingLabels(sel)); err != nil {
		g.localError(w, http.StatusServiceUnavailable, "fail-open: listing pods: "+err.Error())
		return
	}
	var eps []string
	for _, p := range pods.Items {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil || !podReady(&p) {
			continue
		}
		for _, port := range pool.targetPorts {
			eps = append(eps, net.JoinHostPort(p.Status.PodIP, fmt.Sprint(port)))
		}
	}
	if len(eps) == 0 {
		g.localError(w, http.StatusServiceUnavailable, "fail-open: InferencePool "+pool.key.String()+" has no ready endpoint")
		return
	}
	shuffle(eps)
	resp, served, err := g.dial(ctx, pool, eps, r.Method, r.URL.RequestURI(), r.Host, headers, body)
	if err != nil {
		g.count(func(s *Stats) { s.UpstreamFailures++ })
		g.localError(w, http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers: "+err.Error())
		return
	}
	defer resp.Body.Close()
	g.passThrough(w, resp, served)
}

func (g *Gateway) poolSelector(ctx context.Context, pool *poolTarget) (map[string]string, error) {
	var p v1.InferencePool
	if err := g.direct.Get(ctx, pool.key, &p); err != nil {
		return nil, fmt.Errorf("reading InferencePool %s: %w", pool.key, err)
	}
	sel := map[string]string{}
	for k, v := range p.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	return sel, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
