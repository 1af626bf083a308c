// Package app is the poolpicker command as a library, so that a binary
// can add scheduling plugins of its own: its main package imports them
// (each registers itself with scheduling.Register) and calls Main.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/scheduling"
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

// Main runs poolpicker with the process's flags until SIGTERM or SIGINT,
// then exits with its status: 2 for bad flags or configuration (nothing
// was started), 1 for a failure while running. The scheduling plugin types
// a config may name are those registered before it is called.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// options is everything the flags set.
type options struct {
	kubeconfig   string
	printVersion bool
	kubeAPIQPS   float32
	kubeAPIBurst int
	metricsPort  int
	metricNames  metricNames
	controllers  controllers.Options
	extproc      extproc.Options
	scrape       scrape.Options
	scheduling   scheduling.Options
	ha           haOptions
	logging      loggingOptions
	compat       compatOptions
}

func newFlagSet(stderr io.Writer, o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("poolpicker", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path of a kubeconfig file. Empty: $KUBECONFIG, ~/.kube/config, else the in-cluster service account.")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", defaultKubeAPIQPS, "Sustained requests per second to the API server; each served pool costs one list (or streaming list) at start and on a selector change.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", defaultKubeAPIBurst, "Burst of requests to the API server above --kube-api-qps.")
	fs.IntVar(&o.metricsPort, "metrics-port", defaultMetricsPort, "Port of the Prometheus /metrics endpoint.")
	bindMetricNamesFlag(fs, &o.metricNames)
	bindControllersFlags(fs, &o.controllers)
	bindPodWatchFlags(fs, &o.controllers)
	bindExtprocFlags(fs, &o.extproc)
	bindScrapeFlags(fs, &o.scrape)
	bindSchedulingFlags(fs, &o.scheduling)
	bindVersionFlag(fs, &o.printVersion)
	bindHAFlags(fs, &o.controllers, &o.ha)
	bindLoggingFlags(fs, &o.logging)
	bindCompatFlags(fs, &o.compat)
	return fs
}

// run parses args, wires the components and runs them until ctx is
// cancelled. It returns the process exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	var o options
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
	applyServingDefaults(fs, &o)
	if err := completeCompat(&o, os.Getenv); err != nil {
		return usageError(err)
	}
	if err := validate(&o); err != nil {
		return usageError(err)
	}

	log := newLogger(fs, &o.logging, stderr)
	defer klog.Flush()
	ctrl.SetLogger(log)
	logCompatWarnings(log, fs)
	stopTracing, err := startTracing(ctx, &o, log)
	if err != nil {
		return usageError(err)
	}
	defer stopTracing()

	comps, err := build(&o, log)
	if err != nil {
		return usageError(err)
	}
	cfg, err := loadConfig(o.kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "poolpicker: %v\n", err)
		return exitFailed
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	if err := checkPermissions(ctx, cfg, &o.controllers, o.compat.metricsEndpointAuth); err != nil {
		fmt.Fprintf(stderr, "poolpicker: %v\n", err)
		return exitFailed
	}
	c, err := comps.wire(cfg, &o, log)
	if err != nil {
		fmt.Fprintf(stderr, "poolpicker: %v\n", err)
		return exitFailed
	}
	log.Info("starting", "metricsPort", o.metricsPort, "grpcPort", o.extproc.GRPCPort, "grpcHealthPort", o.extproc.HealthPort,
		"watchNamespaces", o.controllers.Namespaces, "poolSelector", o.controllers.PoolSelector,
		"poolName", o.controllers.PoolName, "eppServiceNames", o.controllers.PickerServices,
		"pickerName", o.controllers.PickerName, "podWatchPlan", o.controllers.PodWatchPlan, "leaderElection", o.controllers.LeaderElection, "provisionPickerServices", o.controllers.ProvisionPickerServices)
	if err := c.Start(ctx); err != nil {
		log.Error(err, "stopped on error")
		return exitFailed
	}
	log.Info("stopped")
	return exitOK
}

// validate checks the flags that can be checked without a cluster.
func validate(o *options) error {
	if err := o.controllers.Validate(); err != nil {
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
	scraper *scrape.Manager
	server  *extproc.Server
	// pools is the pool controller, set by wire; readiness reads it.
	pools atomic.Pointer[controllers.Manager]
}

// build makes the scheduler, scraper and ext_proc server over one registry
// and one Prometheus registry.
func build(o *options, log logr.Logger) (*components, error) {
	reg := datastore.NewRegistry()
	// Go runtime and process collectors are in controller-runtime's
	// registry, served beside this one.
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(newBuildInfoGauge(), newExtensionInfoGauge())
	var err error

	o.scheduling.Logger = log.WithName("scheduling")
	if o.scheduling.PluginDuration, err = newPluginDurations(metrics); err != nil {
		return nil, err
	}
	cfg, err := o.scheduling.LoadConfig()
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	for _, w := range cfg.Warnings {
		log.Info("WARNING: scheduling config: "+w, "warning", true)
	}
	// Upstream's conformance manifests turn the conformance-test behaviours
	// on by naming the conformance plugins in their config, not by a flag.
	if cfg.UsesConformanceTestPlugins() && !o.extproc.EnableConformanceTestBehaviors {
		log.Info("WARNING: the scheduling config names conformance-test plugins, so conformance-test behaviours are on: clients can choose their endpoint (never in production)", "warning", true)
		o.extproc.EnableConformanceTestBehaviors = true
	}
	// One knob each: the scraper's staleness threshold decides when the
	// scheduler treats an endpoint as unknown, and the conformance switch
	// enables both the ext_proc echo and the candidate filter.
	o.scheduling.MetricsStaleness = o.scrape.StalenessThreshold
	o.scheduling.EnableConformanceTestFilter = o.extproc.EnableConformanceTestBehaviors
	sched, err := newScheduler(o.scheduling, cfg)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	o.scrape.Registerer, o.scrape.Logger = metrics, log.WithName("scrape")
	scraper, err := scrape.NewManager(o.scrape)
	if err != nil {
		return nil, fmt.Errorf("scraper: %w", err)
	}
	// Observers first: they must hear of every pool from its start.
	reg.AddObserver(scraper)
	reg.AddObserver(sched)

	o.extproc.Registerer, o.extproc.Logger = metrics, log.WithName("extproc")
	cs := &components{reg: reg, metrics: metrics, scraper: scraper}
	o.extproc.PoolsSynced = func() bool {
		m := cs.pools.Load()
		return m != nil && m.HasSynced()
	}
	server, err := extproc.New(reg, sched, o.extproc)
	if err != nil {
		return nil, fmt.Errorf("ext_proc server: %w", err)
	}
	cs.server = server
	return cs, nil
}

// wire adds the reconcilers over cfg and returns the runnable that starts
// every component.
func (cs *components) wire(cfg *rest.Config, o *options, log logr.Logger) (*controllers.Manager, error) {
	reg, metrics, scraper, server := cs.reg, cs.metrics, cs.scraper, cs.server
	o.controllers.Registry, o.controllers.Registerer, o.controllers.Logger = reg, metrics, log.WithName("controllers")
	c, err := controllers.New(cfg, o.controllers)
	if err != nil {
		return nil, err
	}
	cs.pools.Store(c)
	// controller-runtime's own metrics (reconciles, work queues, client
	// requests) live in its global registry; serve both on one endpoint.
	gatherers := renamingGatherer{g: prometheus.Gatherers{metrics, crmetrics.Registry}, names: o.metricNames}
	ms := &metricsServer{addr: net.JoinHostPort(o.ha.bindAddress, strconv.Itoa(o.metricsPort)), gatherer: gatherers, pprof: o.compat.enablePprof, log: log}
	if o.compat.metricsEndpointAuth {
		if ms.filter, err = metricsAuthFilter(cfg); err != nil {
			return nil, err
		}
	}
	for _, r := range []manager.Runnable{scraper, server, ms} {
		if err := c.Add(r); err != nil {
			return nil, err
		}
	}
	return c, nil
}
