// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// server is one metrics page of one model server (a URL read as one
// engine's page): scraped once per interval, however many pools' endpoints
// resolve to it, and its result published to all of them.
type server struct {
	key    targetKey
	target target
	// conn is the page and kept connection of a pollable target, fetched
	// by one of Manager.pollers, poller (nil: scraped through net/http).
	conn   *fetch.Conn
	poller int
	// polled is the page of conn's exchange in flight, parsed on its
	// poller.
	polled datastore.Metrics
	// cpu is the CPU time of a net/http scrape in flight (cpuClock).
	cpu cpuClock
	// slot is the CPU slot of a net/http scrape in flight (cpuSlot): held
	// while it runs, given up while it waits for the network.
	slot cpuSlot
	// job is the scrape in flight.
	job job

	// Guarded by Manager.mu.
	index int          // position in its queue; -1 when not queued
	queue *serverQueue // the queue it is in: Manager.busy or Manager.idle
	// busy is set while one of its pools had a request in the last
	// DemandWindow: it is queued with the busy servers.
	busy bool
	// failures counts the failed scrapes in a row; the interval backs off.
	failures int
	// cost is the mean CPU time of its scrapes; costly is set while they
	// cost more than MaxServerCPUShare pays for.
	cost   time.Duration
	costly bool
	// parkedOn is the pool whose slots were all in use when s was due;
	// counted are the pools whose slots its scrape in flight holds.
	parkedOn *poolSubs
	counted  []*poolSubs
	next     time.Time // when the next scrape is due
	running  bool      // a scrape is in flight
	ctx      context.Context
	cancel   context.CancelFunc
	// done, when set, is closed when the scrape in flight has ended: made
	// only for one who waits for that.
	done chan struct{}
	gone bool // no endpoint resolves to it any more
	// interval is the time from the start of one scrape to the next.
	interval time.Duration
	// demanded is set when an idle pool of the server got a request while
	// a scrape was in flight: the next comes one RefreshInterval later.
	demanded bool
	// lastStart is when the last scrape started; a new subscriber does not
	// trigger another one while that result is fresh enough.
	lastStart time.Time

	// mu guards subs and each sub's fields while a result is published.
	mu   sync.Mutex
	subs map[*sub]struct{}
}

func newServer(o *Options, t target) *server {
	s := &server{key: t.key(), target: t, index: -1, subs: map[*sub]struct{}{}}
	if addr, ok := pollable(t); ok {
		s.conn = fetch.NewConn(t.url, addr, t.path, t.host)
		s.conn.Owner = s
	}
	return s
}

// pollable reports whether t's scrapes can run on a poller: plain http to
// an IP address (a pod's), whose address is returned.
func pollable(t target) (netip.AddrPort, bool) {
	if t.err != nil || t.scheme != "http" {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(t.host)
	return ap, err == nil
}

// closeConn closes the kept connection of a server that no scrape uses,
// reporting whether there was one.
func (s *server) closeConn() bool { return s.conn != nil && s.conn.Close() }

// doneLocked returns the channel closed when s's scrape in flight ends.
func (s *server) doneLocked() <-chan struct{} {
	if s.done == nil {
		s.done = make(chan struct{})
	}
	return s.done
}

// dropConn closes s's kept connection and counts it off.
func (m *Manager) dropConn(s *server) {
	if s.closeConn() {
		m.kept.Add(-1)
	}
}

// sub is one endpoint of one pool, attached to the server its target
// resolves to.
type sub struct {
	pool *datastore.Pool
	ep   *datastore.Endpoint
	srv  *server // guarded by Manager.mu

	// The target is derived from spec and endpoint, and rebuilt when the
	// pool's spec or the endpoint's snapshot (its labels) is replaced.
	spec    *datastore.PoolSpec
	current *datastore.Endpoint
	target  target
	// failing and lastErr keep logs to changes of state.
	failing bool
	lastErr string
	// scrapesCounter is the pool's scrape counter, resolved once.
	scrapesCounter prometheus.Counter
}

// target is where and how to scrape an endpoint.
type target struct {
	url    string
	engine Engine
	err    error
	// scheme, host (ip:port) and path make up url.
	scheme, host, path string
}

// targetKey identifies a server: endpoints with equal keys are one scrape.
type targetKey struct {
	url    string
	engine Engine
	// config is the error of a target that cannot be built.
	config string
}

func (t target) key() targetKey {
	if t.err != nil {
		return targetKey{config: t.err.Error()}
	}
	return targetKey{url: t.url, engine: t.engine}
}

// resolve returns the sub's target, rebuilt only when the pool's spec or
// the endpoint's snapshot was replaced (both are immutable).
func (s *sub) resolve(o *Options) target {
	spec := s.pool.Spec()
	cur, ok := s.pool.Endpoints().Get(s.ep.Address)
	if !ok || cur.Key() != s.ep.Key() {
		cur = s.ep
	}
	if spec == s.spec && cur == s.current {
		return s.target
	}
	s.spec, s.current = spec, cur
	s.target = buildTarget(o, spec, cur)
	return s.target
}

// published records one result of the sub's server on its endpoint, its
// pool's counters and the log.
func (s *sub) published(m *Manager, met *datastore.Metrics, err error) {
	s.scrapesCounter.Inc()
	if h := m.onScrape; h != nil {
		defer func() { h(s.pool.Key, s.ep.Address, err) }()
	}
	if err != nil {
		// Values published while the pool was idle are valid for two idle
		// intervals; once it is busy, a failing server's values go stale
		// by the staleness threshold, as any busy server's.
		if cur := s.ep.Metrics(); cur != nil && cur.Interval > met.Interval {
			cp := *cur
			cp.Interval = met.Interval
			s.ep.SetMetrics(&cp)
		}
		s.fail(m, err)
		return
	}
	s.ep.SetMetrics(met)
	if f := m.opts.Published; f != nil {
		f(s.pool)
	}
	if s.failing {
		s.failing, s.lastErr = false, ""
		m.log.V(2).Info("metrics scrape recovered", "pool", s.pool.Key.String(), "endpoint", s.ep.Address)
	}
}

func (s *sub) fail(m *Manager, err error) {
	reason := fetch.ReasonOf(err)
	m.stats.errors.WithLabelValues(s.pool.Key.Namespace, s.pool.Key.Name, reason).Inc()
	if msg := err.Error(); !s.failing || msg != s.lastErr {
		s.failing, s.lastErr = true, msg
		m.log.Info("metrics scrape failed; keeping the last snapshot until it goes stale", "pool", s.pool.Key.String(), "endpoint", s.ep.Address, "error", msg)
	} else {
		m.log.V(5).Info("metrics scrape failed again", "pool", s.pool.Key.String(), "endpoint", s.ep.Address, "error", msg)
	}
}

// scrapeError is a failed scrape with its reason, the value of the error
// counter's reason label.
type scrapeError = fetch.Error

func failure(reason string, format string, args ...any) error {
	return fetch.Failure(reason, format, args...)
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// fetch scrapes a server that no poller can (https, or a host that is
// not an IP address) once with net/http; parent is the scrape's context,
// whose end means the server is no longer wanted.
func (m *Manager) fetch(parent context.Context, s *server) (datastore.Metrics, error) {
	t := s.target
	if t.err != nil {
		return datastore.Metrics{}, &scrapeError{Reason: "config", Err: t.err}
	}
	ctx, cancel := context.WithTimeout(parent, m.opts.Timeout)
	defer cancel()
	// Its parse runs holding one of cpuSlots, so that at most the
	// budget's whole cores of scrapes parse at once; net/http's transport
	// waits where a slot could not be given up, so it holds none.
	s.slot = cpuSlot{slots: m.cpuSlots, ctx: parent, cpu: &s.cpu}
	buf := bodyPool.Get().(*bytes.Buffer)
	defer bodyPool.Put(buf)
	page, err := m.getHTTPS(ctx, parent, t, buf)
	if err != nil {
		return datastore.Metrics{}, err
	}
	if !s.slot.take() {
		return datastore.Metrics{}, parent.Err()
	}
	defer s.slot.give()
	return m.parse(s, page)
}

// parse reads s's page with a parser of its engine.
func (m *Manager) parse(s *server, page []byte) (datastore.Metrics, error) {
	t := s.target
	p := m.parsers[t.engine].Get().(*Parser)
	defer m.parsers[t.engine].Put(p)
	met, err := p.Parse(page)
	if err != nil {
		return datastore.Metrics{}, failure("parse", "GET %s (%s): %w", t.url, t.engine, err)
	}
	return met, nil
}

// getHTTPS reads an https page with net/http.
func (m *Manager) getHTTPS(ctx, parent context.Context, t target, buf *bytes.Buffer) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return nil, failure("config", "metrics URL %q: %w", t.url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, transportFailure(t.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		return nil, failure("status", "GET %s: HTTP %s", t.url, resp.Status)
	}
	limit := m.opts.MaxBodyBytes
	if resp.ContentLength > limit {
		return nil, failure("too_large", "GET %s: page of %d bytes exceeds the %d-byte cap", t.url, resp.ContentLength, limit)
	}
	buf.Reset()
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength) + 1)
	}
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if ctx.Err() != nil && parent.Err() == nil {
			return nil, failure("timeout", "GET %s: reading the page timed out after %v (%d bytes read)", t.url, m.opts.Timeout, n)
		}
		return nil, failure("body", "GET %s: reading the page after %d bytes: %w", t.url, n, err)
	}
	if n > limit {
		return nil, failure("too_large", "GET %s: page exceeds the %d-byte cap", t.url, limit)
	}
	return buf.Bytes(), nil
}

func transportFailure(u string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return failure("timeout", "GET %s: timed out: %w", u, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return failure("connect", "GET %s: connection refused", u)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return failure("connect", "GET %s: %w", u, err)
	}
	return failure("transport", "GET %s: %w", u, err)
}

func buildTarget(o *Options, spec *datastore.PoolSpec, ep *datastore.Endpoint) target {
	var ann map[string]string
	if spec != nil {
		ann = spec.Annotations
	}
	path, scheme, port := o.Path, o.Scheme, o.Port
	if v, ok := ann[AnnotationMetricsPath]; ok {
		path = strings.TrimSpace(v)
		if !strings.HasPrefix(path, "/") {
			return target{err: fmt.Errorf("pool annotation %s=%q: want an absolute path", AnnotationMetricsPath, v)}
		}
	}
	if v, ok := ann[AnnotationMetricsScheme]; ok {
		scheme = strings.ToLower(strings.TrimSpace(v))
	}
	if scheme != "http" && scheme != "https" {
		return target{err: fmt.Errorf("metrics scheme %q: want http or https (annotation %s)", scheme, AnnotationMetricsScheme)}
	}
	if v, ok := ann[AnnotationMetricsPort]; ok {
		p, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || p < 1 || p > 65535 {
			return target{err: fmt.Errorf("pool annotation %s=%q: want a port number", AnnotationMetricsPort, v)}
		}
		port = int32(p)
	}
	if port == 0 {
		port = ep.Port
	}
	// The most specific choice wins: the pod's own labels over its pool's
	// annotation, poolpicker's label over the upstream one.
	engine := DefaultEngine
	for _, sel := range []struct {
		from  string
		key   string
		value map[string]string
	}{
		{"pool annotation", AnnotationModelServerEngine, ann},
		{"pod " + ep.Pod.String() + " label", LabelEngineType, ep.Labels},
		{"pod " + ep.Pod.String() + " label", LabelModelServerEngine, ep.Labels},
	} {
		v, ok := sel.value[sel.key]
		if !ok {
			continue
		}
		e, err := ParseEngine(v)
		if err != nil {
			return target{err: fmt.Errorf("%s %s: %w", sel.from, sel.key, err)}
		}
		engine = e
	}
	host := net.JoinHostPort(ep.IP, strconv.Itoa(int(port)))
	u := url.URL{Scheme: scheme, Host: host, Path: path}
	return target{url: u.String(), engine: engine, scheme: scheme, host: host, path: u.EscapedPath()}
}

// cpuSlot is a net/http scrape's hold on one of Manager.cpuSlots, taken
// for its parse: one scrape's goroutine uses it, so it needs no lock. The
// scrape's timed CPU (cpu) is its time holding it.
type cpuSlot struct {
	slots chan struct{} // nil: no budget, nothing to wait for
	ctx   context.Context
	cpu   *cpuClock
	held  bool
	span  span
}

// take waits for a slot unless one is held; false when ctx ended first.
func (c *cpuSlot) take() bool {
	if c.held {
		return true
	}
	if c.slots != nil {
		select {
		case c.slots <- struct{}{}:
		case <-c.ctx.Done():
			return false
		}
	}
	c.held = true
	c.span = c.cpu.begin()
	return true
}

// give gives the slot up, if held.
func (c *cpuSlot) give() {
	if c.held {
		c.cpu.end(c.span)
		if c.slots != nil {
			<-c.slots
		}
		c.held = false
	}
}
