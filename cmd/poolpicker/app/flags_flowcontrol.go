// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// flowControlOptions are the flow-control flags: whether it is on, and the
// controller's options.
type flowControlOptions struct {
	enabled bool
	opts    flowcontrol.Options
}

// Flow-control flag names, also the culprits of their errors.
const (
	flagFlowControl              = "flow-control"
	flagFlowControlQueueTTL      = "flow-control-queue-ttl"
	flagFlowControlNoEndpointTTL = "flow-control-no-endpoint-ttl"
	flagFlowControlBandRequests  = "flow-control-max-band-requests"
	flagFlowControlBandBytes     = "flow-control-max-band-bytes"
	flagFlowControlQueuedBytes   = "flow-control-max-queued-bytes"
	flagFlowControlFlowHeader    = "flow-control-flow-header"
	flagFlowControlPerEndpoint   = "flow-control-per-endpoint"
)

// bindFlowControlFlags binds the flow-control flags to o; --help shows the
// controller's defaults.
func bindFlowControlFlags(fs *pflag.FlagSet, o *flowControlOptions) {
	fs.BoolVar(&o.enabled, flagFlowControl, false,
		"Queue requests in the picker while their pool is saturated (see --saturation-queue-depth-threshold), in bands by objective priority, fairly between the flows of a band, instead of forwarding them into the model servers' queues. Also set by the config's flowControl.enabled.")
	fs.DurationVar(&o.opts.QueueTTL, flagFlowControlQueueTTL, flowcontrol.DefaultQueueTTL,
		"Longest a request waits in its pool's queue; then it is answered 429 (QueueTTLExpired). Keep it below the gateway's request timeout.")
	fs.DurationVar(&o.opts.NoEndpointTTL, flagFlowControlNoEndpointTTL, 0,
		"Longest a request to a pool without a ready endpoint waits for one (scale from zero); then it is answered 503 (NoEndpointsTimeout). 0: no waiting room, such requests are answered 503 at once.")
	fs.IntVar(&o.opts.MaxBandRequests, flagFlowControlBandRequests, flowcontrol.DefaultMaxBandRequests,
		"Most requests queued in one priority band of one pool; one more is answered 429 (QueueFull).")
	fs.Int64Var(&o.opts.MaxBandBytes, flagFlowControlBandBytes, flowcontrol.DefaultMaxBandBytes,
		"Most request body bytes queued in one priority band of one pool; one more is answered 429 (QueueFull).")
	fs.Int64Var(&o.opts.MaxQueuedBytes, flagFlowControlQueuedBytes, flowcontrol.DefaultMaxQueuedBytes,
		"Most request body bytes queued over every pool of the process, waiting rooms included, shared fairly between namespaces and pools (--fair-share-reserve-percent); a request its pool's share cannot take is answered 429 (QueueBytesExceeded).")
	fs.StringVar(&o.opts.FlowHeader, flagFlowControlFlowHeader, "",
		"Request header whose value is a request's flow within its band (flows of a band are served in turn), such as a tenant header the gateway sets. Empty: the flow is the request's objective.")
	fs.BoolVar(&o.opts.PerEndpoint, flagFlowControlPerEndpoint, false,
		"Schedule a request when it arrives and hold it for the endpoint picked for it (counted as load there) while that endpoint is saturated, instead of until any endpoint of the pool has a free slot: the model servers' queues stay short, so priority decides more of the wait.")
}

// applyFlowControlConfig takes the config's flowControl section for every
// flag not given on the command line.
func applyFlowControlConfig(o *flowControlOptions, c *scheduling.FlowControlConfig, given func(flag string) bool) {
	if c == nil {
		return
	}
	unset := func(name string) bool { return !given(name) }
	if c.Enabled != nil && unset(flagFlowControl) {
		o.enabled = *c.Enabled
	}
	// The config's durations were checked when it was loaded.
	if d, err := time.ParseDuration(c.QueueTTL); err == nil && unset(flagFlowControlQueueTTL) {
		o.opts.QueueTTL = d
	}
	if d, err := time.ParseDuration(c.NoEndpointTTL); err == nil && unset(flagFlowControlNoEndpointTTL) {
		o.opts.NoEndpointTTL = d
	}
	if c.MaxBandRequests > 0 && unset(flagFlowControlBandRequests) {
		o.opts.MaxBandRequests = c.MaxBandRequests
	}
	if c.MaxBandBytes > 0 && unset(flagFlowControlBandBytes) {
		o.opts.MaxBandBytes = c.MaxBandBytes
	}
	if c.MaxBytes > 0 && unset(flagFlowControlQueuedBytes) {
		o.opts.MaxQueuedBytes = c.MaxBytes
	}
	if c.FlowHeader != "" && unset(flagFlowControlFlowHeader) {
		o.opts.FlowHeader = c.FlowHeader
	}
}

// newFlowController checks the flow-control options and builds the
// controller over sched's saturation detector; nil when flow control is off.
// validateFlowControl checks the flow-control values, from the flags or
// the config, when flow control is on.
func validateFlowControl(o *flowControlOptions) error {
	if !o.enabled {
		return nil
	}
	switch {
	case o.opts.QueueTTL <= 0:
		return fmt.Errorf("--%s %v: must be positive", flagFlowControlQueueTTL, o.opts.QueueTTL)
	case o.opts.NoEndpointTTL < 0:
		return fmt.Errorf("--%s %v: must not be negative", flagFlowControlNoEndpointTTL, o.opts.NoEndpointTTL)
	case o.opts.MaxBandRequests < 1:
		return fmt.Errorf("--%s %d: must be at least 1", flagFlowControlBandRequests, o.opts.MaxBandRequests)
	case o.opts.MaxBandBytes < 1:
		return fmt.Errorf("--%s %d: must be at least 1", flagFlowControlBandBytes, o.opts.MaxBandBytes)
	case o.opts.MaxQueuedBytes < 1:
		return fmt.Errorf("--%s %d: must be at least 1", flagFlowControlQueuedBytes, o.opts.MaxQueuedBytes)
	}
	return nil
}

func newFlowController(o *flowControlOptions, sched *scheduling.Scheduler, metrics prometheus.Registerer, log logr.Logger, waiting, drained func(*datastore.Pool)) (*flowcontrol.Controller, error) {
	if !o.enabled {
		return nil, nil
	}
	fo := o.opts
	fo.EndpointSaturated, fo.EndpointStartsAtOnce = sched.EndpointSaturated, sched.EndpointStartsAtOnce
	fo.Registerer, fo.Logger = metrics, log
	fo.Waiting, fo.Drained = waiting, drained
	return flowcontrol.New(fo)
}
