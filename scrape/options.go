// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"runtime"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// Defaults of Options.
const (
	// DefaultRefreshInterval is the time between two scrapes of an endpoint.
	DefaultRefreshInterval = 50 * time.Millisecond
	// DefaultDemandWindow is how long after its last request a pool counts
	// as busy, its servers scraped every RefreshInterval.
	DefaultDemandWindow = 5 * time.Second
	// DefaultIdleRefreshInterval is the longest interval of an idle
	// server (--idle-refresh-metrics-interval's default too): 50,000 idle
	// endpoints cost about 1,700 scrapes a second.
	DefaultIdleRefreshInterval = 30 * time.Second
	// DefaultTimeout bounds one scrape.
	DefaultTimeout = time.Second
	// DefaultStalenessThreshold is the age past which a snapshot is stale and
	// its endpoint's load unknown (see datastore.Metrics.Fresh).
	DefaultStalenessThreshold = 2 * time.Second
	// DefaultMaxBodyBytes caps a metrics page: a vLLM page is tens to a few
	// hundred kilobytes.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxIdleConnsPerHost keeps an https server's connection, and one
	// more for a server reached under two metrics paths.
	DefaultMaxIdleConnsPerHost = 2
	// LimitInFlightScrapes names the slots of MaxConcurrentScrapes in the
	// fair-share metrics (poolpicker_fair_share_*{limit="in_flight_scrapes"}):
	// each pool's scrapes in flight and its guaranteed share.
	LimitInFlightScrapes = "in_flight_scrapes"
	// DefaultMaxConcurrentScrapes bounds the scrapes in flight: enough for
	// thousands of servers at 50 ms over a cluster network, where a scrape
	// takes a few milliseconds, while servers that hang until the timeout
	// hold only their own slots.
	DefaultMaxConcurrentScrapes = 256
	// DefaultMaxErrorBackoff is the longest interval of a failing server:
	// after each failure in a row its interval doubles from RefreshInterval
	// up to it.
	DefaultMaxErrorBackoff = 10 * time.Second
	// DefaultMaxIdleConns bounds idle connections across all https servers;
	// it must exceed their number or keep-alive thrashes.
	DefaultMaxIdleConns = 4096
	// DefaultMaxServerCPUShare is the share of one core a server's scrapes
	// may use: a page that costs 10 ms to read is read at most every
	// 200 ms, a real vLLM page (about 0.1 ms) every 2 ms.
	DefaultMaxServerCPUShare = 0.05
	// DefaultPath is the metrics path of a model server.
	DefaultPath = "/metrics"
	// DefaultScheme is the scheme metrics are fetched with.
	DefaultScheme = "http"
)

// Pool annotations and the pod label that configure scraping per pool and
// per pod; they override Options.
const (
	// AnnotationMetricsPath is the metrics path of the pool's servers.
	AnnotationMetricsPath = "poolpicker.io/metrics-path"
	// AnnotationMetricsPort is the metrics port of the pool's servers, when
	// it is not the target port.
	AnnotationMetricsPort = "poolpicker.io/metrics-port"
	// AnnotationMetricsScheme is http or https.
	AnnotationMetricsScheme = "poolpicker.io/metrics-scheme"
	// AnnotationModelServerEngine names the engine of the pool's servers
	// (ParseEngine); DefaultEngine without it.
	AnnotationModelServerEngine = "poolpicker.io/model-server-engine"
	// LabelEngineType is the upstream picker's pod label naming the pod's
	// engine; it overrides the pool's annotation.
	LabelEngineType = "inference.networking.k8s.io/engine-type"
	// LabelModelServerEngine on a pod overrides both.
	LabelModelServerEngine = "poolpicker.io/model-server-engine"
)

// Options configure a Manager. Zero values mean the documented defaults.
type Options struct {
	// RefreshInterval is the time between scrapes of one server; zero
	// means DefaultRefreshInterval.
	RefreshInterval time.Duration
	// IdleRefreshInterval is the longest time between scrapes of a server
	// none of whose pools had a request in the last DemandWindow: after a
	// pool's last request its servers' interval doubles from RefreshInterval
	// up to it, and the pool's next request has them scraped at once while
	// it is routed on their last values, valid for two intervals, and
	// poolpicker's in-flight counts. Zero means DefaultIdleRefreshInterval;
	// negative (or not above RefreshInterval) scrapes every server every
	// RefreshInterval, busy or not.
	IdleRefreshInterval time.Duration
	// DemandWindow is how long after its last request a pool counts as busy;
	// zero means DefaultDemandWindow.
	DemandWindow time.Duration
	// Timeout bounds one scrape: connecting, the request and reading the
	// page; zero means DefaultTimeout.
	Timeout time.Duration
	// StalenessThreshold is the age past which a snapshot is stale; zero
	// means DefaultStalenessThreshold. The pool aggregates count fresh
	// endpoints only; the scheduler is given the same value.
	StalenessThreshold time.Duration
	// MaxBodyBytes caps a page; a larger one fails the scrape. Zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxConcurrentScrapes bounds the scrapes in flight at once; a due
	// scrape waits for a free slot. The slots are shared fairly between
	// namespaces and their pools (internal/fairshare, the rule of every
	// process-wide limit, FairShareReservePercent kept for pools with none
	// in flight): a pool may borrow the slots others leave idle, but a
	// tenant whose servers hang until the timeout never holds another's
	// guaranteed share. Zero means DefaultMaxConcurrentScrapes.
	MaxConcurrentScrapes int
	// FairShareReservePercent is the part of MaxConcurrentScrapes kept for
	// pools with no scrape in flight (fairshare.Options.ReservePercent).
	// Zero: fairshare's default; negative: none.
	FairShareReservePercent int
	// CPUBudget is the CPU the scrapes may use, in cores: scrapes are
	// admitted at the rate it pays for (their mean cost, by the thread's
	// CPU clock), and they run on one poller per whole core (at least
	// one), so that picks and stream handling keep the rest of the cores. When it cannot pay for every busy server at RefreshInterval,
	// busy pools share it by request rate. Zero means half of GOMAXPROCS;
	// negative means no budget.
	CPUBudget float64
	// MaxConcurrentScrapesPerPool bounds the scrapes in flight of one
	// pool's servers, so that servers that hang until the timeout stall
	// their own pool only; zero means a quarter of MaxConcurrentScrapes, at
	// least 1 (64 of 256: a pool scraped at 2 ms a scrape still gets 32,000
	// scrapes a second). A server several pools hold counts against each.
	MaxConcurrentScrapesPerPool int
	// MaxServerCPUShare is the share of one core (of a poller's time) one
	// server's scrapes may use: a server whose scrape cost c is not scraped
	// again for c/MaxServerCPUShare, however short its interval, so that a
	// server whose pages are costly to read slows its own pools only. Zero
	// means DefaultMaxServerCPUShare; negative means no bound.
	MaxServerCPUShare float64
	// MaxErrorBackoff is the longest interval of a failing server, whose
	// interval doubles from RefreshInterval with each failure in a row;
	// zero means DefaultMaxErrorBackoff.
	MaxErrorBackoff time.Duration
	// MaxIdleConns bounds the keep-alive connections kept to idle servers
	// (and, separately, the idle https connections); zero means
	// DefaultMaxIdleConns. An http server is scraped over a connection of
	// its own: a busy server always keeps it, an idle one past the bound
	// closes it after each scrape and dials again the next time.
	MaxIdleConns int
	// MaxIdleConnsPerHost bounds idle connections to one https server; zero
	// means DefaultMaxIdleConnsPerHost.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes an https connection idle that long, such as one
	// to a removed endpoint; zero means twice IdleRefreshInterval, at least
	// 20 refresh intervals and a second.
	IdleConnTimeout time.Duration
	// Path is the metrics path; empty means DefaultPath. A pool's
	// AnnotationMetricsPath overrides it.
	Path string
	// Port is the metrics port; zero means each endpoint's target port. A
	// pool's AnnotationMetricsPort overrides it.
	Port int32
	// Scheme is http or https; empty means DefaultScheme. A pool's
	// AnnotationMetricsScheme overrides it.
	Scheme string
	// VerifyServerCertificates verifies model servers' certificates over
	// https against the system's roots. Zero skips verification: model
	// servers' certificates are usually self-signed.
	VerifyServerCertificates bool
	// MetricNames rename the default engine's (vLLM's) metrics.
	MetricNames MetricNameOverrides
	// DisableFastPath parses whole pages with expfmt instead of only the
	// used families' lines: several times the CPU, for diagnosis.
	DisableFastPath bool
	// Published, when set, is told of every scrape published on an
	// endpoint of pool, on the scraping goroutine: flow control looks at the
	// pool's saturation again. It must return at once.
	Published func(pool *datastore.Pool)
	// Registerer receives the pool aggregate gauges and scrape counters;
	// nil registers nothing.
	Registerer prometheus.Registerer
	// Logger logs scrape failures and recoveries, keyed by pool; the zero
	// value discards.
	Logger logr.Logger

	// names are every engine's families, MetricNames applied; set by
	// NewManager.
	names map[Engine]*MetricNames
}

func (o *Options) setDefaults() {
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultRefreshInterval
	}
	if o.IdleRefreshInterval == 0 {
		o.IdleRefreshInterval = DefaultIdleRefreshInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.DemandWindow <= 0 {
		o.DemandWindow = DefaultDemandWindow
	}
	if o.StalenessThreshold <= 0 {
		o.StalenessThreshold = DefaultStalenessThreshold
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxConcurrentScrapes <= 0 {
		o.MaxConcurrentScrapes = DefaultMaxConcurrentScrapes
	}
	switch {
	case o.CPUBudget == 0:
		o.CPUBudget = float64(runtime.GOMAXPROCS(0)) / 2
	case o.CPUBudget < 0:
		o.CPUBudget = 0
	}
	if o.MaxConcurrentScrapesPerPool <= 0 {
		o.MaxConcurrentScrapesPerPool = max(o.MaxConcurrentScrapes/4, 1)
	}
	switch {
	case o.MaxServerCPUShare == 0:
		o.MaxServerCPUShare = DefaultMaxServerCPUShare
	case o.MaxServerCPUShare < 0:
		o.MaxServerCPUShare = 0
	}
	if o.MaxErrorBackoff <= 0 {
		o.MaxErrorBackoff = DefaultMaxErrorBackoff
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = DefaultMaxIdleConns
	}
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = max(2*o.IdleRefreshInterval, 20*o.RefreshInterval, time.Second)
	}
	if o.Path == "" {
		o.Path = DefaultPath
	}
	if o.Scheme == "" {
		o.Scheme = DefaultScheme
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
}

// Validate reports an option that cannot work: a metric name override that
// does not parse. NewManager calls it; a command calls it first, to refuse
// bad flags before anything is built.
func (o Options) Validate() error {
	_, err := resolveNames(o.MetricNames)
	return err
}
