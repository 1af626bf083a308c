// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
)

// upstreamPoolGroup is the only InferencePool API group poolpicker serves,
// the default of upstream's --pool-group.
const upstreamPoolGroup = "inference.networking.k8s.io"

// compatOptions are the flags of the upstream EPPs (the Inference
// Extension's and the llm-d router's) that poolpicker has no other flag for.
// Each has upstream's name, meaning and default; a flag whose feature
// poolpicker lacks is accepted and, when set to anything but what poolpicker
// does anyway, named in a start-up warning (noEffectFlags), so a Deployment
// written for upstream starts unchanged and never silently behaves otherwise.
type compatOptions struct {
	poolGroup                        string
	endpointSelector                 string
	endpointTargetPorts              []int
	disableEndpointSubsetFilter      bool
	refreshPrometheusMetricsInterval time.Duration
	healthChecking                   bool
	emitEndpointScores               bool
	enableGRPCStreamMetrics          bool
	allowExperimentalPlugins         bool
	grpcMaxRecvMsgSize               string
	grpcMaxSendMsgSize               string
}

func bindCompatFlags(fs *pflag.FlagSet, o *compatOptions) {
	fs.StringVar(&o.poolGroup, "pool-group", upstreamPoolGroup,
		"API group of the InferencePools served; only "+upstreamPoolGroup+" (v1) is.")
	fs.StringVar(&o.endpointSelector, "endpoint-selector", "",
		"Upstream's pool-less mode (model-server pods by label selector). Not supported: pools are always read from InferencePool objects; accepted with a warning.")
	fs.IntSliceVar(&o.endpointTargetPorts, "endpoint-target-ports", nil,
		"Target ports of upstream's pool-less mode; see --endpoint-selector. Accepted with a warning.")
	fs.BoolVar(&o.disableEndpointSubsetFilter, "disable-endpoint-subset-filter", false,
		"Upstream's switch to ignore the gateway's endpoint subset hint. Not supported (the hint is always honoured); accepted with a warning when true.")
	fs.DurationVar(&o.refreshPrometheusMetricsInterval, "refresh-prometheus-metrics-interval", 5*time.Second,
		"Upstream's period of refreshing its pool gauges. No effect: poolpicker's gauges change when their pool does; accepted with a warning when set.")
	fs.BoolVar(&o.healthChecking, "health-checking", false,
		"Also serve the gRPC health service on the ext_proc port (--grpc-port), for gateways that health-check the picker cluster.")
	fs.BoolVar(&o.emitEndpointScores, "emit-endpoint-scores", false,
		"Add to each decision's envoy.lb dynamic metadata the key x-gateway-destination-endpoint-scores: a struct of every endpoint the scheduler scored (ip:port) to its weighted total score, picked or not.")
	fs.BoolVar(&o.enableGRPCStreamMetrics, "enable-grpc-stream-metrics", false,
		"llm-d router's ext_proc stream metrics. No effect (poolpicker's request metrics are always on); accepted with a warning when true.")
	fs.BoolVar(&o.allowExperimentalPlugins, "allow-experimental-plugins", false,
		"llm-d router's switch for alpha plugins. No effect: every plugin poolpicker has is available; accepted with a warning when true.")
	fs.StringVar(&o.grpcMaxRecvMsgSize, "grpc-max-recv-msg-size", "",
		"Largest gRPC message the ext_proc server takes (e.g. 20MiB, 25MB, 1048576). A BUFFERED gateway sends a whole request body in one message. Empty: --max-request-body-bytes plus 64 KiB.")
	fs.StringVar(&o.grpcMaxSendMsgSize, "grpc-max-send-msg-size", "",
		"llm-d router's largest gRPC message sent (e.g. 10MiB). No effect: the ext_proc server sends messages up to gRPC's own limit (2 GiB); accepted with a warning when set.")
}

// noEffectFlag is an accepted flag whose feature poolpicker lacks: setting it
// to anything but inert (as --help prints values) earns a start-up warning.
type noEffectFlag struct {
	name  string
	inert func(value string) bool
	why   string
}

func isValue(v string) func(string) bool { return func(s string) bool { return s == v } }
func isEmpty(s string) bool              { return s == "" || s == "[]" }
func never(string) bool                  { return false }

// noEffectFlags lists the accepted flags that change nothing here, in --help order.
var noEffectFlags = []noEffectFlag{
	{"allow-experimental-plugins", isValue("false"), "every poolpicker plugin is available without it"},
	{"disable-endpoint-subset-filter", isValue("false"), "the gateway's endpoint subset hint is always honoured"},
	{"enable-grpc-stream-metrics", isValue("false"), "poolpicker's request metrics are always exported"},
	{"endpoint-selector", isEmpty, "pools are always read from InferencePool objects"},
	{"endpoint-target-ports", isEmpty, "pools are always read from InferencePool objects"},
	{"grpc-max-send-msg-size", never, "the ext_proc server sends messages up to gRPC's own limit (2 GiB)"},
	{"refresh-prometheus-metrics-interval", never, "pool gauges change when their pool does"},
}

// noEffectWarnings returns one warning per no-effect flag set on the command
// line to a value that would change something upstream.
func noEffectWarnings(fs *pflag.FlagSet) []string {
	var out []string
	for _, nf := range noEffectFlags {
		f := fs.Lookup(nf.name)
		if f == nil || !f.Changed || nf.inert(f.Value.String()) {
			continue
		}
		out = append(out, fmt.Sprintf("--%s=%s has no effect: %s", nf.name, f.Value.String(), nf.why))
	}
	return out
}

// completeCompat applies the compat flags that poolpicker honours and checks
// them: --pool-group must be the served group, and with --pool-name but no
// --pool-namespace the pool's namespace is $NAMESPACE (upstream charts set it
// from the pod's own namespace), else the default.
func completeCompat(o *options, getenv func(string) string) error {
	if o.compat.poolGroup != upstreamPoolGroup {
		return fmt.Errorf("--pool-group %q: poolpicker serves InferencePools of %s (v1) only", o.compat.poolGroup, upstreamPoolGroup)
	}
	if o.controllers.PoolName != "" && o.controllers.PoolNamespace == "" {
		o.controllers.PoolNamespace = getenv("NAMESPACE")
	}
	if slices.ContainsFunc(o.compat.endpointTargetPorts, func(p int) bool { return p < 1 || p > 65535 }) {
		return fmt.Errorf("--endpoint-target-ports %v: ports must be 1..65535", o.compat.endpointTargetPorts)
	}
	if s := strings.TrimSpace(o.compat.grpcMaxRecvMsgSize); s != "" {
		n, err := parseByteSize(s)
		if err != nil {
			return fmt.Errorf("--grpc-max-recv-msg-size %q: %w", s, err)
		}
		if n < 1 {
			return fmt.Errorf("--grpc-max-recv-msg-size %q: must be positive", s)
		}
		o.extproc.MaxRecvMsgBytes = n
	}
	if s := strings.TrimSpace(o.compat.grpcMaxSendMsgSize); s != "" {
		if _, err := parseByteSize(s); err != nil {
			return fmt.Errorf("--grpc-max-send-msg-size %q: %w", s, err)
		}
	}
	o.extproc.HealthOnGRPCPort = o.compat.healthChecking
	o.extproc.EmitEndpointScores = o.compat.emitEndpointScores
	return completeTLS(o)
}

// logCompatWarnings logs the start-up warnings of the compat flags.
func logCompatWarnings(log logr.Logger, fs *pflag.FlagSet) {
	for _, w := range append(noEffectWarnings(fs), tlsWarnings(fs)...) {
		log.Info("WARNING: "+w, "warning", true)
	}
}

// parseByteSize reads a size as the llm-d router's gRPC size flags take it:
// a Kubernetes quantity ("10Mi", "25M", "1048576") with an optional trailing
// B or b ("10MiB", "25MB").
func parseByteSize(s string) (int, error) {
	s = strings.TrimSpace(s)
	if len(s) > 1 && (s[len(s)-1] == 'B' || s[len(s)-1] == 'b') {
		s = s[:len(s)-1]
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("not a size (like 10MiB, 25MB or 1048576): %w", err)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("must be a whole number of bytes from 0 to 2 GiB")
	}
	return int(n), nil
}
