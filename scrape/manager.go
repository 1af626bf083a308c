package scrape

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/datastore"
)

// Manager runs one scraper per endpoint of every pool it hears of. It is a
// datastore.Observer: register it with Registry.AddObserver before pools
// exist, then run Start. Endpoints that appear before Start are scraped from
// Start on.
type Manager struct {
	opts      Options
	log       logr.Logger
	transport *http.Transport
	client    *http.Client
	stats     *statsCollector

	scrapes atomic.Uint64
	errors  atomic.Uint64
	// onScrape, when set before Start, hears of every finished scrape (tests).
	onScrape func(pool datastore.PoolKey, address string, err error)

	mu sync.Mutex
	// ctx is Start's context; nil before Start.
	ctx     context.Context
	stopped bool
	pools   map[datastore.PoolKey]*poolScrapers
}

type poolScrapers struct {
	pool     *datastore.Pool
	scrapers map[datastore.EndpointKey]*scraper
}

var _ datastore.Observer = (*Manager)(nil)

// NewManager returns a manager; its collectors are registered on
// opts.Registerer now.
func NewManager(opts Options) (*Manager, error) {
	opts.setDefaults()
	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		// Pod IPs are never reached through a proxy.
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		MaxIdleConns:        opts.MaxIdleConns,
		MaxIdleConnsPerHost: opts.MaxIdleConnsPerHost,
		IdleConnTimeout:     opts.IdleConnTimeout,
		// Decompressing costs more CPU than the bytes cost on a cluster network.
		DisableCompression:    true,
		ResponseHeaderTimeout: opts.Timeout,
		TLSHandshakeTimeout:   opts.Timeout,
		TLSClientConfig:       &tls.Config{InsecureSkipVerify: opts.InsecureSkipVerify}, //nolint:gosec // operator's choice for self-signed servers
	}
	m := &Manager{
		opts:      opts,
		log:       opts.Logger,
		transport: transport,
		client: &http.Client{
			Transport: transport,
			// A metrics endpoint that redirects is misconfigured; following
			// it could send the picker anywhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		pools: map[datastore.PoolKey]*poolScrapers{},
	}
	m.stats = newStatsCollector(m)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(m.stats); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// StalenessThreshold is the effective staleness threshold.
func (m *Manager) StalenessThreshold() time.Duration { return m.opts.StalenessThreshold }

// Stats counts scrapes and failed scrapes since the manager was made.
type Stats struct {
	Scrapes uint64
	Errors  uint64
}

// Stats returns the scrape counts.
func (m *Manager) Stats() Stats { return Stats{Scrapes: m.scrapes.Load(), Errors: m.errors.Load()} }

// Start runs the scrapers until ctx is done, then stops them all, waits for
// them and returns nil. It may be called once.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("scrape: manager already started")
	}
	m.ctx = ctx
	for _, ps := range m.pools {
		for _, s := range ps.scrapers {
			s.launch(ctx)
		}
	}
	m.mu.Unlock()

	<-ctx.Done()

	m.mu.Lock()
	m.stopped = true
	var all []*scraper
	for _, ps := range m.pools {
		for _, s := range ps.scrapers {
			all = append(all, s)
		}
	}
	m.mu.Unlock()
	stopAll(all)
	m.transport.CloseIdleConnections()
	return nil
}

// EndpointsChanged starts scrapers for added endpoints and stops removed
// ones; a removed endpoint's scraper has exited when it returns, so its
// server gets no request after that.
func (m *Manager) EndpointsChanged(pool *datastore.Pool, added, removed []*datastore.Endpoint) {
	m.mu.Lock()
	ps := m.pools[pool.Key]
	if ps == nil || ps.pool != pool {
		if ps != nil {
			// A pool of the same name came back before we heard the old one
			// leave; its scrapers go with it.
			defer stopAll(ps.allScrapers())
		}
		ps = &poolScrapers{pool: pool, scrapers: map[datastore.EndpointKey]*scraper{}}
		m.pools[pool.Key] = ps
	}
	var stopping []*scraper
	// Removals first: an endpoint can leave and come back under the same key
	// with a new address in one change.
	for _, e := range removed {
		if s := ps.scrapers[e.Key()]; s != nil && s.ep.Address == e.Address {
			delete(ps.scrapers, e.Key())
			stopping = append(stopping, s)
		}
	}
	for _, e := range added {
		if old := ps.scrapers[e.Key()]; old != nil {
			stopping = append(stopping, old)
		}
		s := newScraper(m, pool, e)
		ps.scrapers[e.Key()] = s
		if m.ctx != nil && !m.stopped {
			s.launch(m.ctx)
		}
	}
	if len(ps.scrapers) == 0 {
		delete(m.pools, pool.Key)
	}
	m.mu.Unlock()
	stopAll(stopping)
}

// PoolRemoved stops the pool's scrapers, waits for them, and drops the
// pool's exported series.
func (m *Manager) PoolRemoved(pool *datastore.Pool) {
	m.mu.Lock()
	ps := m.pools[pool.Key]
	if ps != nil && ps.pool == pool {
		delete(m.pools, pool.Key)
	} else {
		ps = nil
	}
	m.mu.Unlock()
	if ps != nil {
		stopAll(ps.allScrapers())
	}
	m.stats.forgetPool(pool.Key)
}

func (ps *poolScrapers) allScrapers() []*scraper {
	out := make([]*scraper, 0, len(ps.scrapers))
	for _, s := range ps.scrapers {
		out = append(out, s)
	}
	return out
}

// scrapedPools returns the pools with scrapers, for the aggregates.
func (m *Manager) scrapedPools() []*datastore.Pool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*datastore.Pool, 0, len(m.pools))
	for _, ps := range m.pools {
		out = append(out, ps.pool)
	}
	return out
}

// stopAll cancels the scrapers, then waits for them, so they wind down
// together rather than one after another.
func stopAll(scrapers []*scraper) {
	for _, s := range scrapers {
		s.cancelRun()
	}
	for _, s := range scrapers {
		s.wait()
	}
}
