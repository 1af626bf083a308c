// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/controllers"
)

// defaultDrainGracePeriod leaves gateways and Service endpoints time to see
// a replica turn unready (a readiness probe period or two) before its
// listener closes.
const defaultDrainGracePeriod = 5 * time.Second

// haOptions are the flags of a shared, replicated deployment that do not
// belong to one component's Options.
type haOptions struct {
	bindAddress      string
	drainGracePeriod time.Duration
}

// bindHAFlags binds the flags of serving pools across namespaces from
// several replicas: which pools a deployment serves, leader election,
// picker Service provisioning, drain and bind address.
func bindHAFlags(fs *pflag.FlagSet, o *controllers.Options, ha *haOptions) {
	if o.PickerNamespace == "" {
		o.PickerNamespace = os.Getenv("POD_NAMESPACE")
	}
	if ha.drainGracePeriod == 0 {
		ha.drainGracePeriod = defaultDrainGracePeriod
	}
	fs.BoolVar(&o.LeaderElection, "ha-enable-leader-election", o.LeaderElection,
		"Elect a leader among the replicas with a Lease (named --picker-name, in --picker-namespace). Only the leader writes (pool claims, picker Services and EndpointSlices); every replica serves ext_proc.")
	fs.DurationVar(&o.LeaseDuration, "ha-leader-election-lease-duration", o.LeaseDuration,
		"How long a leader's Lease lasts without renewal: a dead leader is replaced after about this long. Zero: 15s.")
	fs.DurationVar(&o.RenewDeadline, "ha-leader-election-renew-deadline", o.RenewDeadline,
		"How long the leader keeps trying to renew before it steps down: its writes pause and it campaigns again, serving all along. Zero: 10s, or 2/3 of a shorter lease duration.")
	fs.DurationVar(&o.RetryPeriod, "ha-leader-election-retry-period", o.RetryPeriod,
		"How often replicas try to acquire or renew the Lease. Zero: 2s, or half of a shorter renew deadline.")
	fs.StringVar(&o.PickerName, "picker-name", controllers.DefaultPickerName,
		"Name of this poolpicker deployment: its Lease, the "+controllers.PickerLabel+" label on its pods, on objects it provisions and (by default) on the pools it serves, and its pool claims ("+controllers.ClaimAnnotation+"=NAMESPACE/NAME).")
	fs.StringVar(&o.PickerNamespace, "picker-namespace", o.PickerNamespace,
		"Namespace this deployment runs in (its Lease and pods). Empty: $POD_NAMESPACE, else "+controllers.DefaultPickerNamespace+".")
	fs.StringVar(&o.PickerPodSelector, "picker-pod-selector", o.PickerPodSelector,
		"Label selector of this deployment's own pods in --picker-namespace; their ready ones are the endpoints of provisioned picker Services. Empty: "+controllers.PickerLabel+"=<picker-name>.")
	fs.BoolVar(&o.ProvisionPickerServices, "provision-picker-services", o.ProvisionPickerServices,
		"For each served pool whose spec.endpointPickerRef Service does not exist, create it in the pool's namespace (selector-less, owned by the pool) with an EndpointSlice listing this deployment's ready replicas. Existing Services and slices it did not create are never changed (reported as conflicts).")
	fs.DurationVar(&ha.drainGracePeriod, "drain-grace-period", ha.drainGracePeriod,
		"On SIGTERM, how long readiness reports NOT_SERVING while new ext_proc streams are still accepted, before the listener closes and --drain-timeout starts.")
	fs.StringVar(&ha.bindAddress, "bind-address", ha.bindAddress,
		"IP address the ext_proc, health and metrics servers listen on. Empty: all interfaces.")
}
