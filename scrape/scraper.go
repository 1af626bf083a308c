package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// scraper scrapes one endpoint of one pool until cancelled.
type scraper struct {
	m    *Manager
	pool *datastore.Pool
	ep   *datastore.Endpoint

	cancel context.CancelFunc // nil until launched
	done   chan struct{}

	// Fields below are the run goroutine's own.
	ctx context.Context
	// target is derived from spec and endpoint, and rebuilt when the pool's
	// spec or the endpoint's snapshot (its labels) is replaced.
	spec    *datastore.PoolSpec
	current *datastore.Endpoint
	target  target
	parsers map[Engine]*Parser
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
}

func newScraper(m *Manager, pool *datastore.Pool, ep *datastore.Endpoint) *scraper {
	return &scraper{m: m, pool: pool, ep: ep, done: make(chan struct{}), parsers: map[Engine]*Parser{}}
}

// launch starts the run goroutine; the caller holds m.mu.
func (s *scraper) launch(parent context.Context) {
	s.ctx, s.cancel = context.WithCancel(parent)
	go s.run()
}

func (s *scraper) cancelRun() {
	if s.cancel != nil {
		s.cancel()
	}
}

// wait returns when the run goroutine has exited (at once if never launched).
func (s *scraper) wait() {
	if s.cancel != nil {
		<-s.done
	}
}

func (s *scraper) run() {
	defer close(s.done)
	s.scrapesCounter = s.m.stats.scrapes.WithLabelValues(s.pool.Key.Namespace, s.pool.Key.Name)
	ticker := time.NewTicker(s.m.opts.RefreshInterval)
	defer ticker.Stop()
	for {
		// First scrape at once, so a new endpoint is known within a round trip.
		s.scrapeOnce()
		select {
		case <-s.ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (s *scraper) scrapeOnce() {
	m, err := s.fetch()
	if s.ctx.Err() != nil {
		// Stopped mid-scrape: the endpoint left, not a failure.
		return
	}
	s.m.scrapes.Add(1)
	s.scrapesCounter.Inc()
	if h := s.m.onScrape; h != nil {
		defer func() { h(s.pool.Key, s.ep.Address, err) }()
	}
	if err != nil {
		s.fail(err)
		return
	}
	m.ScrapedAt = time.Now()
	s.ep.SetMetrics(&m)
	if s.failing {
		s.failing, s.lastErr = false, ""
		s.m.log.V(2).Info("metrics scrape recovered", "pool", s.pool.Key.String(), "endpoint", s.ep.Address)
	}
}

func (s *scraper) fail(err error) {
	s.ep.CountScrapeError()
	s.m.errors.Add(1)
	reason := "transport"
	var se *scrapeError
	if errors.As(err, &se) {
		reason = se.reason
	}
	s.m.stats.errors.WithLabelValues(s.pool.Key.Namespace, s.pool.Key.Name, reason).Inc()
	if msg := err.Error(); !s.failing || msg != s.lastErr {
		s.failing, s.lastErr = true, msg
		s.m.log.Info("metrics scrape failed; keeping the last snapshot until it goes stale", "pool", s.pool.Key.String(), "endpoint", s.ep.Address, "error", msg)
	} else {
		s.m.log.V(5).Info("metrics scrape failed again", "pool", s.pool.Key.String(), "endpoint", s.ep.Address, "error", msg)
	}
}

// scrapeError is a failed scrape with its reason, the value of the error
// counter's reason label.
type scrapeError struct {
	reason string
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

func failure(reason string, format string, args ...any) error {
	return &scrapeError{reason: reason, err: fmt.Errorf(format, args...)}
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *scraper) fetch() (datastore.Metrics, error) {
	t := s.resolveTarget()
	if t.err != nil {
		return datastore.Metrics{}, &scrapeError{reason: "config", err: t.err}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.m.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return datastore.Metrics{}, failure("config", "metrics URL %q: %w", t.url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.m.client.Do(req)
	if err != nil {
		return datastore.Metrics{}, transportFailure(t.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		return datastore.Metrics{}, failure("status", "GET %s: HTTP %s", t.url, resp.Status)
	}
	limit := s.m.opts.MaxBodyBytes
	if resp.ContentLength > limit {
		return datastore.Metrics{}, failure("too_large", "GET %s: page of %d bytes exceeds the %d-byte cap", t.url, resp.ContentLength, limit)
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	defer bodyPool.Put(buf)
	buf.Reset()
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength) + 1)
	}
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if ctx.Err() != nil && s.ctx.Err() == nil {
			return datastore.Metrics{}, failure("timeout", "GET %s: reading the page timed out after %v (%d bytes read)", t.url, s.m.opts.Timeout, n)
		}
		return datastore.Metrics{}, failure("body", "GET %s: reading the page after %d bytes: %w", t.url, n, err)
	}
	if n > limit {
		return datastore.Metrics{}, failure("too_large", "GET %s: page exceeds the %d-byte cap", t.url, limit)
	}
	m, err := s.parser(t.engine).Parse(buf.Bytes())
	if err != nil {
		return datastore.Metrics{}, failure("parse", "GET %s (%s): %w", t.url, t.engine, err)
	}
	return m, nil
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

func (s *scraper) parser(e Engine) *Parser {
	p := s.parsers[e]
	if p == nil {
		p = NewParser(e.Names(s.m.opts.MetricNames))
		p.fullParse = s.m.opts.DisableFastPath
		s.parsers[e] = p
	}
	return p
}

// resolveTarget returns the endpoint's target, rebuilt only when the pool's
// spec or the endpoint's snapshot was replaced (both are immutable).
func (s *scraper) resolveTarget() target {
	spec := s.pool.Spec()
	cur, ok := s.pool.Endpoints().Get(s.ep.Address)
	if !ok || cur.Key() != s.ep.Key() {
		cur = s.ep
	}
	if spec == s.spec && cur == s.current {
		return s.target
	}
	s.spec, s.current = spec, cur
	s.target = buildTarget(&s.m.opts, spec, cur)
	return s.target
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
	engine := VLLM
	if v, ok := ann[AnnotationModelServerEngine]; ok {
		e, err := ParseEngine(v)
		if err != nil {
			return target{err: fmt.Errorf("pool annotation %s: %w", AnnotationModelServerEngine, err)}
		}
		engine = e
	}
	if v, ok := ep.Labels[LabelModelServerEngine]; ok {
		e, err := ParseEngine(v)
		if err != nil {
			return target{err: fmt.Errorf("pod %s label %s: %w", ep.Pod, LabelModelServerEngine, err)}
		}
		engine = e
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(ep.IP, strconv.Itoa(int(port))), Path: path}
	return target{url: u.String(), engine: engine}
}
