// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package app is the poolpicker command as a library, so that a binary
// can add scheduling plugins of its own:
// app.NewCommand(app.WithPlugin(type, factory)).Main().
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/debugview"
	"github.com/poolpicker/poolpicker/peersync"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
	"github.com/poolpicker/poolpicker/scrape"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // a failure while running (API server, ports)
	exitUsage  = 2 // bad flags or configuration: nothing was started
)

// Defaults of the flags that main owns.
const (
	defaultMetricsPort  = 9090
	defaultKubeAPIQPS   = 50
	defaultKubeAPIBurst = 100
)

// defaultProcs is GOMAXPROCS as the runtime set it at start (the cores
// the process may use), before build adds the scrape pollers' Ps.
var defaultProcs = runtime.GOMAXPROCS(0)

// options is everything the flags set.
type options struct {
	kubeconfig    string
	printVersion  bool
	kubeAPIQPS    float32
	kubeAPIBurst  int
	metricsPort   int
	metricNames   metricNames
	controllers   controllers.Options
	extproc       extproc.Options
	scrape        scrape.Options
	scheduling    scheduling.Options
	flowControl   flowControlOptions
	peerSync      peerSyncOptions
	ha            haOptions
	logging       loggingOptions
	observability observabilityOptions
	compat        compatOptions

	// prefixIndexMaxBytes is the prefix indexes' process-wide memory
	// budget (prefix.NewMemory).
	prefixIndexMaxBytes int64
}

// flagGroups are the sections of --help, in order: one per component that
// owns the options its flags set, as kube-scheduler's --help reads.
var flagGroups = []string{"general", "pools and pod watches", "request path (ext_proc)", "TLS", "model-server metrics", "scheduling", "flow control", "high availability", "peer sync", "logging", "observability", "upstream compatibility"}

func newFlagSet(stderr io.Writer, o *options) *pflag.FlagSet {
	var groups cliflag.NamedFlagSets
	for _, name := range flagGroups {
		groups.FlagSet(name)
	}
	general := groups.FlagSet("general")
	general.StringVar(&o.kubeconfig, "kubeconfig", "", "Path of a kubeconfig file. Empty: $KUBECONFIG, ~/.kube/config, else the in-cluster service account.")
	general.Float32Var(&o.kubeAPIQPS, "kube-api-qps", defaultKubeAPIQPS, "Sustained requests per second to the API server; each served pool costs one list (or streaming list) at start and on a selector change.")
	general.IntVar(&o.kubeAPIBurst, "kube-api-burst", defaultKubeAPIBurst, "Burst of requests to the API server above --kube-api-qps.")
	general.IntVar(&o.metricsPort, "metrics-port", defaultMetricsPort, "Port of the Prometheus /metrics endpoint.")
	bindVersionFlag(general, &o.printVersion)
	bindControllersFlags(groups.FlagSet("pools and pod watches"), &o.controllers)
	bindPodWatchFlags(groups.FlagSet("pools and pod watches"), &o.controllers)
	bindExtprocFlags(groups.FlagSet("request path (ext_proc)"), &o.extproc)
	bindTLSFlags(groups.FlagSet("TLS"), &o.extproc)
	bindMetricNamesFlag(groups.FlagSet("model-server metrics"), &o.metricNames)
	bindScrapeFlags(groups.FlagSet("model-server metrics"), &o.scrape)
	bindSchedulingFlags(groups.FlagSet("scheduling"), &o.scheduling)
	bindPrefixIndexFlag(groups.FlagSet("scheduling"), &o.prefixIndexMaxBytes)
	bindFlowControlFlags(groups.FlagSet("flow control"), &o.flowControl)
	bindHAFlags(groups.FlagSet("high availability"), &o.controllers, &o.ha)
	bindPeerSyncFlags(groups.FlagSet("peer sync"), &o.peerSync)
	bindLoggingFlags(groups.FlagSet("logging"), &o.logging)
	bindObservabilityFlags(groups.FlagSet("observability"), &o.observability)
	bindCompatFlags(groups.FlagSet("upstream compatibility"), &o.compat)

	fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, name := range groups.Order {
		fs.AddFlagSet(groups.FlagSets[name])
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "poolpicker serves many InferencePools' endpoint picks over ext_proc.\n\nUsage:\n  poolpicker [flags]\n")
		cliflag.PrintSections(stderr, groups, 0)
	}
	return fs
}

// run parses args, wires the components, with plugins resolving the
// scheduling config's plugin types, and runs them until ctx is cancelled.
// It returns the process exit code.
func run(ctx context.Context, args []string, stderr io.Writer, plugins *framework.Registry) int {
	var o options
	o.scheduling.Registry = plugins
	o.scheduling.BaseContext = func() context.Context { return ctx }
	fs := newFlagSet(stderr, &o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "poolpicker: %v\nRun 'poolpicker --help' for the flags.\n", err)
		return exitUsage
	}
	usageError := func(err error) int {
		fmt.Fprintf(stderr, "poolpicker: %v\nRun 'poolpicker --help' for the flags.\n", err)
		return exitUsage
	}
	if o.printVersion {
		printVersion(os.Stdout)
		return exitOK
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Errorf("unexpected arguments %q: poolpicker takes flags only", fs.Args()))
	}
	schedCfg, err := o.scheduling.LoadConfig()
	if err != nil {
		return usageError(fmt.Errorf("scheduler: %w", err))
	}
	completeWarnings, err := complete(&o, completeInputs{getenv: os.Getenv, given: fs.Changed, config: schedCfg})
	if err != nil {
		return usageError(err)
	}
	if err := validate(&o); err != nil {
		return usageError(err)
	}

	log := newLogger(fs, &o.logging, stderr)
	defer klog.Flush()
	ctrl.SetLogger(log)
	logCompatWarnings(log, fs)
	for _, w := range completeWarnings {
		log.Info("WARNING: "+w, "warning", true)
	}
	stopTracing, err := startTracing(ctx, &o, log)
	if err != nil {
		return usageError(err)
	}
	defer stopTracing()

	comps, err := build(&o, schedCfg, log)
	if err != nil {
		return usageError(err)
	}
	cfg, err := loadConfig(o.kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "poolpicker: %v\n", err)
		return exitFailed
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	ms, err := comps.metricsServer(cfg, &o, log)
	if err != nil {
		fmt.Fprintf(stderr, "poolpicker: %v\n", err)
		return exitFailed
	}
	log.Info("starting", "metricsPort", o.metricsPort, "grpcPort", o.extproc.GRPCPort, "grpcHealthPort", o.extproc.HealthPort,
		"watchNamespaces", o.controllers.Namespaces, "poolSelector", o.controllers.PoolSelector,
		"poolName", o.controllers.PoolName, "eppServiceNames", o.controllers.PickerServices,
		"pickerName", o.controllers.PickerName, "podWatchPlan", o.controllers.PodWatchPlan, "leaderElection", o.controllers.LeaderElection, "provisionPickerServices", o.controllers.ProvisionPickerServices)
	if err := comps.serve(ctx, cfg, &o, ms, log); err != nil {
		if !comps.connected.Load() {
			// Start-up refused (a missing permission, bad credentials,
			// a port taken): said plainly, before the controllers ran.
			fmt.Fprintf(stderr, "poolpicker: %v\n", err)
			return exitFailed
		}
		log.Error(err, "stopped on error")
		return exitFailed
	}
	log.Info("stopped")
	return exitOK
}

// validate checks the flags that can be checked without a cluster: each
// component's options by its own Validate, then what the command owns.
func validate(o *options) error {
	if err := o.controllers.Validate(); err != nil {
		return err
	}
	if err := o.extproc.Validate(); err != nil {
		return err
	}
	if err := o.scrape.Validate(); err != nil {
		return err
	}
	if err := o.scheduling.Validate(); err != nil {
		return err
	}
	for name, port := range map[string]int{"--metrics-port": o.metricsPort, "--grpc-port": o.extproc.GRPCPort, "--grpc-health-port": o.extproc.HealthPort} {
		if port < 1 || port > 65535 {
			return fmt.Errorf("%s %d: must be 1..65535", name, port)
		}
	}
	if o.metricsPort == o.extproc.GRPCPort || o.metricsPort == o.extproc.HealthPort || o.extproc.GRPCPort == o.extproc.HealthPort {
		return fmt.Errorf("--metrics-port %d, --grpc-port %d and --grpc-health-port %d must differ", o.metricsPort, o.extproc.GRPCPort, o.extproc.HealthPort)
	}
	if err := validatePeerSync(o); err != nil {
		return err
	}
	if err := validateFlowControl(&o.flowControl); err != nil {
		return err
	}
	if o.kubeAPIQPS <= 0 || o.kubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d must be positive", o.kubeAPIQPS, o.kubeAPIBurst)
	}
	return nil
}

func loadConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the API server configuration (--kubeconfig %q): %w", kubeconfig, err)
	}
	return cfg, nil
}

// components are the parts that need no cluster to be built, so that their
// configuration errors are reported before connecting.
type components struct {
	reg     *datastore.Registry
	metrics *prometheus.Registry
	sched   *scheduling.Scheduler
	scraper *scrape.Manager
	server  *extproc.Server
	// peers is peer sync's exchange; nil when off.
	peers *peersync.Exchange
	// pools are the controllers' parts, set once the API server has
	// answered; readiness and flow control read them.
	pools atomic.Pointer[controllers.Parts]
	// connected is set once the API server has answered at start-up.
	connected atomic.Bool
	// waiting is poolpicker_waiting_for_api_server.
	waiting prometheus.Gauge
}

// build makes the scheduler (from cfg, the loaded scheduling config),
// scraper and ext_proc server over one registry and one Prometheus
// registry. The options are derived already (derive); what build adds to
// them is wiring: loggers, registerers and the parts it made.
func build(o *options, cfg *scheduling.Config, log logr.Logger) (*components, error) {
	reg := datastore.NewRegistry()
	// Go runtime and process collectors are in controller-runtime's
	// registry, served beside this one.
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(newBuildInfoGauge(), newExtensionInfoGauge())
	var err error

	o.scheduling.Logger, o.scheduling.Registerer = log.WithName("scheduling"), metrics
	// One prefix-index budget for every scorer instance and KV-event
	// index, under the share rule of every other limit.
	memory := prefix.NewMemory(o.prefixIndexMaxBytes, o.extproc.FairShareReservePercent)
	if err := metrics.Register(memory); err != nil {
		return nil, err
	}
	if base := o.scheduling.BaseContext; base != nil {
		o.scheduling.BaseContext = func() context.Context { return prefix.WithMemory(base(), memory) }
	} else {
		o.scheduling.BaseContext = func() context.Context { return prefix.WithMemory(context.Background(), memory) }
	}
	if o.scheduling.PluginDuration, err = newPluginDurations(metrics); err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings {
		log.Info("WARNING: scheduling config: "+w, "warning", true)
	}
	cs := &components{reg: reg, metrics: metrics}
	var sched *scheduling.Scheduler
	if cs.peers, err = newPeerSync(o, reg, &sched, cs.peerAddresses, metrics, log.WithName("peersync")); err != nil {
		return nil, err
	}
	if sched, err = scheduling.New(cfg, o.scheduling); err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	fc, err := newFlowController(&o.flowControl, sched, metrics, log.WithName("flowcontrol"), cs.poolWaiting, cs.poolDrained)
	if err != nil {
		return nil, fmt.Errorf("flow control: %w", err)
	}
	if fc != nil {
		o.scrape.Published, o.extproc.FlowControl = fc.Wake, fc
	}
	o.scrape.Registerer, o.scrape.Logger = metrics, log.WithName("scrape")
	scraper, err := scrape.NewManager(o.scrape)
	if err != nil {
		return nil, fmt.Errorf("scraper: %w", err)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// A P of its own for each scrape poller, beside the request
		// path's: a poller's thread runs at a lower priority, and while
		// it holds a P the kernel would run a pick's thread at once, but
		// Go's scheduler would not without a free P. An operator's
		// GOMAXPROCS is kept as set.
		runtime.GOMAXPROCS(defaultProcs + scraper.Pollers())
	}
	// Observers first: they must hear of every pool from its start.
	reg.AddObserver(scraper)
	reg.AddObserver(sched)
	if fc != nil {
		reg.AddObserver(fc)
	}

	o.extproc.Registerer, o.extproc.Logger = metrics, log.WithName("extproc")
	cs.scraper, cs.sched = scraper, sched
	cs.waiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "poolpicker_waiting_for_api_server",
		Help: "1 while start-up waits for the API server to answer (readiness NOT_SERVING; the reason is logged); 0 once it has.",
	})
	metrics.MustRegister(cs.waiting)
	o.extproc.PoolsSynced = func() bool {
		p := cs.pools.Load()
		return p != nil && p.InitialSync.HasSynced()
	}
	server, err := extproc.New(reg, sched, o.extproc)
	if err != nil {
		return nil, fmt.Errorf("ext_proc server: %w", err)
	}
	cs.server = server
	return cs, nil
}

// metricsServer is the /metrics endpoint over both registries.
func (cs *components) metricsServer(cfg *rest.Config, o *options, log logr.Logger) (*metricsServer, error) {
	// controller-runtime's own metrics (reconciles, work queues, client
	// requests) live in its global registry; serve both on one endpoint.
	gatherers := renamingGatherer{g: prometheus.Gatherers{cs.metrics, crmetrics.Registry}, names: o.metricNames}
	ms := &metricsServer{addr: net.JoinHostPort(o.ha.bindAddress, strconv.Itoa(o.metricsPort)), gatherer: gatherers, pprof: o.observability.enablePprof, log: log,
		debug: debugview.Handler(debugview.Options{Registry: cs.reg, Decisions: cs.sched.RecentDecisions})}
	ms.tls = metricsTLSFrom(o)
	if o.observability.metricsEndpointAuth {
		var err error
		if ms.filter, err = metricsAuthFilter(cfg); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// serve runs the data plane (scrapes, ext_proc and health, /metrics) and
// the controllers, which start once the API server answers (connect), until
// ctx ends or a part fails. The data plane never waits long for the API
// server: it starts as soon as the API server has answered, or has failed
// to (connectGrace), so that a replica started during an outage is up,
// live and not ready (readiness waits for the controllers' first sync). On
// ctx the data plane drains first, while the controllers keep its pools
// fresh, and the controllers stop after it.
func (cs *components) serve(ctx context.Context, cfg *rest.Config, o *options, ms *metricsServer, log logr.Logger) error {
	servingCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	controllersCtx, stopControllers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopControllers()

	type result struct {
		c   *controllerProcess
		err error
	}
	connected := make(chan result, 1)
	unavailable := make(chan struct{})
	go func() {
		c, err := cs.connect(servingCtx, cfg, o, log, func() { close(unavailable) })
		connected <- result{c, err}
	}()
	var conn *result
	grace := time.NewTimer(connectGrace)
	select {
	case r := <-connected:
		// Answered at once: a refusal ends start-up before anything
		// listens, as a bad flag does.
		if r.err != nil || r.c == nil {
			grace.Stop()
			return r.err
		}
		conn = &r
	case <-unavailable:
	case <-grace.C:
	}
	grace.Stop()

	// The data plane: its parts start together; the first to fail stops
	// the others, and a start-up still waiting for the API server.
	var data errgroup.Group
	runnables := []manager.Runnable{cs.scraper, cs.server, ms}
	if cs.peers != nil {
		runnables = append(runnables, cs.peers)
	}
	for _, r := range runnables {
		data.Go(func() error {
			err := r.Start(servingCtx)
			if err != nil {
				stopServing()
			}
			return err
		})
	}

	if conn == nil {
		r := <-connected
		conn = &r
	}
	if conn.err != nil || conn.c == nil {
		stopServing()
		return errors.Join(conn.err, data.Wait())
	}
	cs.connected.Store(true)
	// The controllers: once they end, for whatever reason, so does the
	// data plane, whose pools they no longer keep fresh.
	var ctrl errgroup.Group
	ctrl.Go(func() error {
		defer stopServing()
		return conn.c.Start(controllersCtx)
	})
	// Stop in order: the data plane drains while the controllers keep its
	// pools fresh, then the controllers stop.
	<-servingCtx.Done()
	dataErr := data.Wait()
	stopControllers()
	return errors.Join(dataErr, ctrl.Wait())
}

// peerAddresses are the replicas the controllers found for peer sync
// (none before they run).
func (cs *components) peerAddresses() []string {
	if p := cs.pools.Load(); p != nil && p.Peers != nil {
		return p.Peers.Addresses()
	}
	return nil
}

// poolWaiting records on the pool that requests wait for its first ready
// endpoint, for its owners and autoscalers: an Event, and the leader's
// requests-waiting annotation.
func (cs *components) poolWaiting(pool *datastore.Pool) {
	if p := cs.pools.Load(); p != nil {
		p.Events.PoolEvent(pool.Key, false, "RequestsWaiting", "requests wait in the picker for the pool's first ready endpoint (flow control's waiting room)")
		p.Waiting.SetRequestsWaiting(pool.Key, true)
	}
}

// poolDrained has the leader remove the pool's requests-waiting annotation:
// nothing waits for an endpoint any more.
func (cs *components) poolDrained(pool *datastore.Pool) {
	if p := cs.pools.Load(); p != nil {
		p.Waiting.SetRequestsWaiting(pool.Key, false)
	}
}

// controllerProcess is the controller-runtime manager that runs the
// reconcilers of package controllers, with the parts they share added as
// its runnables.
type controllerProcess struct {
	mgr   manager.Manager
	parts *controllers.Parts
}

// newControllers makes the manager over cfg, sets the reconcilers up on it
// and adds their runnables; readiness follows their initial sync from then
// on. Nothing runs until Start.
func (cs *components) newControllers(cfg *rest.Config, o *options, log logr.Logger) (*controllerProcess, error) {
	o.controllers.Registry, o.controllers.Registerer, o.controllers.Logger = cs.reg, cs.metrics, log.WithName("controllers")
	mopts, err := controllers.ManagerOptions(o.controllers)
	if err != nil {
		return nil, err
	}
	mgr, err := manager.New(cfg, mopts)
	if err != nil {
		return nil, fmt.Errorf("controllers: creating manager: %w", err)
	}
	parts, err := controllers.Setup(mgr, o.controllers)
	if err != nil {
		return nil, err
	}
	for _, r := range parts.Runnables() {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	cs.pools.Store(parts)
	return &controllerProcess{mgr: mgr, parts: parts}, nil
}

// Start runs the manager until ctx ends, then waits for every pod watch to
// end. It returns nil on a clean stop.
func (c *controllerProcess) Start(ctx context.Context) error {
	err := c.mgr.Start(ctx)
	// The reconcilers have ended (or failed to start): no new watch can
	// begin. The sources' runnable stops them when it ran; this is for a
	// manager that failed before it.
	c.parts.Sources.Stop()
	return err
}
