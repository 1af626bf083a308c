// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"time"

	"github.com/poolpicker/poolpicker/controllers"
)

// deriveInputs are what derive needs besides the options: facts about the
// flag set and the scheduling config.
type deriveInputs struct {
	// poolSelectorSet: --pool-selector was given (even empty).
	poolSelectorSet bool
	// conformancePlugins: the scheduling config names the conformance-test
	// plugins.
	conformancePlugins bool
}

// shutdownMargin is what the controllers' stop may take beyond the
// ext_proc drain it follows.
const shutdownMargin = 10 * time.Second

// derive sets the values one component's options take from another's, or
// from a setting several components share, so that one setting never has
// two knobs that could disagree: the last step of complete, pure as it is.
// It returns the warnings to log.
func derive(o *options, in deriveInputs) (warnings []string) {
	c := &o.controllers
	// Serving is opt-in: a deployment given no rule of its own
	// (--pool-selector, --pool-name, --epp-service-name) serves only the
	// pools labelled poolpicker.io/picker=<--picker-name>. An explicit
	// --pool-selector="" serves every pool.
	if !in.poolSelectorSet && c.PoolName == "" && len(c.PickerServices) == 0 {
		c.PoolSelector = controllers.PickerLabel + "=" + c.PickerName
	}
	o.extproc.DrainGracePeriod = o.ha.drainGracePeriod
	o.extproc.BindAddress = o.ha.bindAddress
	// Provisioned EndpointSlices list the port the replicas serve on.
	c.PickerPort = int32(o.extproc.GRPCPort)
	// Bounds the controllers' stop, which follows the ext_proc drain: as
	// long as the drain itself may take.
	c.GracefulShutdownTimeout = o.ha.drainGracePeriod + o.extproc.DrainTimeout + shutdownMargin

	// Upstream's conformance manifests turn the conformance-test behaviours
	// on by naming the conformance plugins in their config, not by a flag.
	if in.conformancePlugins && !o.extproc.EnableConformanceTestBehaviors {
		warnings = append(warnings, "the scheduling config names conformance-test plugins, so conformance-test behaviours are on: clients can choose their endpoint (never in production)")
		o.extproc.EnableConformanceTestBehaviors = true
	}
	// The conformance switch enables both the ext_proc echo and the
	// candidate filter; the scraper's staleness threshold decides when the
	// scheduler treats an endpoint's load as unknown.
	o.scheduling.EnableConformanceTestFilter = o.extproc.EnableConformanceTestBehaviors
	o.scheduling.MetricsStaleness = o.scrape.StalenessThreshold
	// Peer sync without a static list finds its peers among the
	// deployment's ready pods, at the peer-sync port.
	if o.peerSync.enabled && len(o.peerSync.peers) == 0 {
		c.PeerPort = int32(o.peerSync.port)
	}
	// One share rule for every process-wide limit: flow control's queued
	// bytes are shared as the streams and held bodies are.
	o.flowControl.opts.FairShareReservePercent = o.extproc.FairShareReservePercent
	o.scrape.FairShareReservePercent = o.extproc.FairShareReservePercent
	return warnings
}
