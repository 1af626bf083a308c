// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// The Manager's state, construction and run; its parts are in dispatch, slots, interval, subscriptions.

package scrape

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// Manager keeps the metrics of every endpoint of every pool it hears of
// fresh. One dispatcher goroutine takes the model servers from a queue
// ordered by due time and scrapes them, at most MaxConcurrentScrapes at once:
// on a poller (one goroutine per whole core of the budget, each with many
// scrapes in flight), or, for https, on a goroutine that lives for that
// scrape only. Endpoints of several
// pools that resolve to the same metrics URL and engine are one server,
// scraped once per interval, the result published to each.
//
// It is a datastore.Observer: register it with Registry.AddObserver before
// pools exist, then run Start. Endpoints that appear before Start are
// scraped from Start on.
type Manager struct {
	opts      Options
	log       logr.Logger
	transport *http.Transport
	client    *http.Client
	stats     *statsCollector
	// parsers hold each engine's parsers: one per scrape in flight, not
	// per server.
	parsers map[Engine]*sync.Pool

	scrapes atomic.Uint64
	errors  atomic.Uint64
	// started counts the scrapes begun: one in timedEvery is timed.
	started atomic.Uint64
	// kept counts the http servers' kept connections.
	kept atomic.Int64
	// onScrape, when set before Start, hears of every finished scrape of
	// every pool's endpoint (tests).
	onScrape func(pool datastore.PoolKey, address string, err error)

	// slots bounds the scrapes in flight; inflight counts them. share
	// divides them fairly between namespaces and pools (a server several
	// pools hold is charged to each); starved are the pools with servers
	// waiting aside and none in flight, which a slot freed anywhere may
	// serve.
	slots    chan struct{}
	share    *fairshare.Limit
	starved  []*poolSubs
	inflight sync.WaitGroup
	// pollers run the scrapes of pollable servers (Start's); polling
	// counts their goroutines; nextPoller is the poller of the next new
	// server.
	pollers    []fetch.Fetcher
	npollers   int
	polling    sync.WaitGroup
	nextPoller int
	// wake tells the dispatcher the head of the queue changed.
	wake chan struct{}
	// budget admits the scrapes at the rate Options.CPUBudget pays for;
	// cpuSlots bounds the scrapes running at once (not waiting for the
	// network) to its whole cores (nil: no budget).
	budget   *budget
	cpuSlots chan struct{}

	// demandMu guards demanded, the pools PoolDemanded heard of that the
	// dispatcher has not handled yet: the request path appends to it and
	// never waits for mu. ended is set when the dispatcher has returned;
	// demandTimer wakes the dispatcher demandDelay after the first pool
	// noted.
	demandMu    sync.Mutex
	demanded    []*datastore.Pool
	ended       bool
	demandTimer *time.Timer

	mu sync.Mutex
	// ctx is Start's context; nil before Start.
	ctx     context.Context
	stopped bool
	pools   map[datastore.PoolKey]*poolSubs
	servers map[targetKey]*server
	// nextPlan is when the busy pools' shares of the budget are set again;
	// slowed counts the pools refreshed less often than RefreshInterval,
	// longest is the longest of their intervals.
	nextPlan time.Time
	slowed   int
	longest  time.Duration
	// budgetWait is when a due scrape began waiting for the budget.
	budgetWait time.Time
	// busy and idle are the servers waiting for their next scrape, by due
	// time: those of a pool with requests in the last DemandWindow, and the
	// others. A busy server due is scraped before an idle one.
	busy, idle serverQueue
	// parks counts the servers set aside for their pool's slots (tests).
	parks int
	// planned are the pools the next plan looks at: each that has had a
	// busy server or a parked one, or an interval of its own, since the
	// plan before. The others need nothing of it, and at ten thousand
	// pools a plan over all of them held mu, and a core, for 10-20 ms.
	planned map[*poolSubs]struct{}
}

type poolSubs struct {
	pool *datastore.Pool
	subs map[datastore.EndpointKey]*sub
	// slots is the pool's account of the scrapes in flight (Manager.share);
	// starved is set while it is in Manager.starved.
	slots   *fairshare.Party
	starved bool
	// inflight counts the pool's servers being scraped, at most
	// MaxConcurrentScrapesPerPool; parked are its servers due meanwhile.
	inflight int
	parked   []*server
	// interval is the time between scrapes of its busy servers that the
	// scrape budget allows, zero when RefreshInterval fits; requests are
	// the pool's request count when it was set.
	interval time.Duration
	requests uint64
}

var (
	_ datastore.Observer       = (*Manager)(nil)
	_ datastore.DemandObserver = (*Manager)(nil)
)

// NewManager returns a manager; its collectors are registered on
// opts.Registerer now.
func NewManager(opts Options) (*Manager, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	names, _ := resolveNames(opts.MetricNames) // validated
	opts.names = names
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
		TLSClientConfig:       &tls.Config{InsecureSkipVerify: !opts.VerifyServerCertificates}, // the operator's choice for self-signed servers
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
		slots: make(chan struct{}, opts.MaxConcurrentScrapes),
		share: fairshare.New(fairshare.Options{Name: LimitInFlightScrapes, Flag: "metrics-max-concurrent-scrapes", Unit: "scrapes",
			Capacity: int64(opts.MaxConcurrentScrapes), ReservePercent: opts.FairShareReservePercent}),
		budget:  newBudget(opts.CPUBudget),
		wake:    make(chan struct{}, 1),
		pools:   map[datastore.PoolKey]*poolSubs{},
		planned: map[*poolSubs]struct{}{},
		servers: map[targetKey]*server{},
	}
	m.npollers = max(1, int(opts.CPUBudget))
	if opts.CPUBudget <= 0 {
		m.npollers = runtime.GOMAXPROCS(0)
	}
	m.demandTimer = time.AfterFunc(time.Hour, m.wakeDispatcher)
	m.demandTimer.Stop()
	if opts.CPUBudget > 0 {
		m.cpuSlots = make(chan struct{}, max(1, int(opts.CPUBudget)))
	}
	m.parsers = make(map[Engine]*sync.Pool, len(names))
	for e, n := range names {
		m.parsers[e] = &sync.Pool{New: func() any {
			p := NewParser(*n)
			p.fullParse = opts.DisableFastPath
			return p
		}}
	}
	m.stats = newStatsCollector(m)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(m.stats); err != nil {
			return nil, err
		}
		if err := opts.Registerer.Register(m.share); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Pollers is the number of poller goroutines Start runs, each on a thread
// of its own at a lower priority than the process's: one per whole core
// of the budget, at least one; without a budget, one per P.
func (m *Manager) Pollers() int { return m.npollers }

// StalenessThreshold is the effective staleness threshold.
func (m *Manager) StalenessThreshold() time.Duration { return m.opts.StalenessThreshold }

// Stats counts the requests to model servers and the failed ones since the
// manager was made, and the servers scraped now.
type Stats struct {
	Scrapes uint64
	Errors  uint64
	Servers int
}

// Stats returns the scrape counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	n := len(m.servers)
	m.mu.Unlock()
	return Stats{Scrapes: m.scrapes.Load(), Errors: m.errors.Load(), Servers: n}
}

// Start scrapes until ctx is done, then waits for the scrapes in flight
// and returns nil. It may be called once.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("scrape: manager already started")
	}
	m.ctx = ctx
	m.mu.Unlock()

	for range m.npollers {
		p, err := fetch.New(fetch.Options{
			MaxPageBytes: m.opts.MaxBodyBytes, Timeout: m.opts.Timeout, Kept: &m.kept,
			Parse: m.parsePolled, Complete: m.completePolled,
		})
		if err != nil {
			for _, p := range m.pollers {
				p.Stop()
			}
			m.polling.Wait()
			return err
		}
		m.pollers = append(m.pollers, p)
		m.polling.Go(p.Run)
	}

	m.dispatch(ctx)
	for _, p := range m.pollers {
		p.Stop()
	}

	m.demandMu.Lock()
	m.ended, m.demanded = true, nil
	m.demandTimer.Stop()
	m.demandMu.Unlock()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	// Every scrape's context is ctx's child, and the pollers end theirs:
	// they are ending.
	m.inflight.Wait()
	m.polling.Wait()
	m.mu.Lock()
	for _, s := range m.servers {
		m.dropConn(s)
	}
	m.mu.Unlock()
	m.transport.CloseIdleConnections()
	return nil
}
