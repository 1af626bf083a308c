// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// Defaults of Options.
const (
	// DefaultPoolNamespace is the namespace of PoolName when PoolNamespace is empty.
	DefaultPoolNamespace = "default"
	// DefaultMaxConcurrentReconciles bounds parallel pool reconciles; a
	// reconcile never waits on the API server (watches start in the
	// background), so a few suffice for thousands of pools.
	DefaultMaxConcurrentReconciles = 4
	// DefaultPickerName names a deployment when Options.PickerName is empty.
	DefaultPickerName = "poolpicker"
	// DefaultPickerNamespace is where the replicas run when
	// Options.PickerNamespace is empty.
	DefaultPickerNamespace = "default"
	// DefaultPickerPort is the ext_proc port listed in provisioned
	// EndpointSlices when Options.PickerPort is zero.
	DefaultPickerPort = 9002
	// DefaultLeaseDuration, DefaultRenewDeadline and DefaultRetryPeriod
	// pace leader election as kube-controller-manager does: a dead leader is
	// replaced within about LeaseDuration + RetryPeriod.
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	// DefaultNamespaceWatchThreshold is the number of served pools from
	// which the auto plan watches a namespace's pods once for all of them
	// (podsource.DefaultNamespaceWatchThreshold says why).
	DefaultNamespaceWatchThreshold = podsource.DefaultNamespaceWatchThreshold
	// DefaultGracefulShutdownTimeout bounds how long the manager waits for
	// reconcilers and added runnables to end once its context is cancelled.
	DefaultGracefulShutdownTimeout = 30 * time.Second
)

// Options configure the controllers (ManagerOptions and Setup). The zero
// value of each field is its documented default; flags are bound to it in
// cmd/poolpicker.
type Options struct {
	// Registry receives the served pools. Required.
	Registry *datastore.Registry

	// Namespaces limits the InferencePools (and objectives, rewrites) served
	// to these namespaces. Empty: all namespaces.
	Namespaces []string
	// PoolSelector is a label selector (kubectl syntax, e.g.
	// "shard=a,tier in (gold)") on InferencePool objects: only matching pools
	// are served, so several poolpicker deployments can split a cluster's
	// pools. It is sent to the API server. Empty: every pool.
	PoolSelector string
	// PoolName, when set, serves only that pool (the reference EPP's
	// single-pool mode). Namespaces and PoolSelector must then be empty
	// or agree with it.
	PoolName string
	// PoolNamespace is PoolName's namespace. Empty: DefaultPoolNamespace.
	// Set only together with PoolName.
	PoolNamespace string
	// PickerServices are the names of the Services this picker is deployed
	// behind. A pool is served only when its spec.endpointPickerRef names one
	// of them (in the pool's namespace). Empty: any pool whose
	// endpointPickerRef is a Service, or unset, is served.
	PickerServices []string

	// PickerName names this deployment of poolpicker: the Lease its
	// replicas elect a leader with is PickerName in PickerNamespace, objects
	// it provisions carry the label PickerLabel=PickerName, and pools it
	// serves are claimed for PickerNamespace/PickerName (ClaimAnnotation).
	// Empty: DefaultPickerName.
	PickerName string
	// ReplicaName names this replica in the waiting signal it writes on
	// pools (ReplicaWaitingAnnotationPrefix): unique among the replicas
	// and at most 63 characters. Empty: the host name (the pod's name),
	// cut to 63 characters.
	ReplicaName string
	// PickerNamespace is the namespace the replicas run in (their Lease and
	// pods). Empty: DefaultPickerNamespace.
	PickerNamespace string
	// PickerPodSelector selects this deployment's own pods in
	// PickerNamespace (a label selector, kubectl syntax); their ready ones
	// are the endpoints of provisioned picker Services. Empty:
	// PickerLabel=PickerName.
	PickerPodSelector string
	// PickerPort is the port the replicas serve ext_proc on, listed in
	// provisioned EndpointSlices. Zero: DefaultPickerPort.
	PickerPort int32
	// PeerPort, when set, has Setup watch this deployment's own
	// ready pods (PickerPodSelector) for peer sync: Parts.Peers
	// lists them at this port. Zero: no such watch.
	PeerPort int32
	// ProvisionPickerServices makes the leader create, for each served pool
	// whose spec.endpointPickerRef Service does not exist, that Service in
	// the pool's namespace (selector-less, owned by the pool) and an
	// EndpointSlice listing the ready replicas. Objects it did not create
	// are never modified; such a conflict is reported on the pool.
	ProvisionPickerServices bool

	// LeaderElection elects one replica, with a Lease, to run the writers
	// (pool claims, picker Services and EndpointSlices); every replica runs
	// the data plane (watches, scrapes, ext_proc) regardless. Zero: no
	// election, this process writes (a single replica).
	LeaderElection bool
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election.
	// Zero: DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// DisableStreamingLists makes each pod watch start with a plain list
	// and a watch from its version, instead of one streaming list (a watch
	// that first sends every matching pod). Streaming lists halve the
	// requests at start (1,000 pools synced in 6 s instead of 18 s at 50
	// QPS). Zero: streaming lists, where the API server offers them.
	DisableStreamingLists bool

	// PodWatchPlan is how the pods of a namespace's served pools are
	// watched: podsource.PlanPerPool (a selector-scoped watch per pool),
	// podsource.PlanNamespace (one watch of the namespace's pods, filtered
	// here by each pool's selector) or podsource.PlanAuto (chosen per
	// namespace by its number of served pools, see
	// NamespaceWatchThreshold). A namespace switching plans keeps serving
	// each pool from its old watch until the new one has listed, then
	// replaces the pool's endpoints in one swap. The watch of this
	// deployment's own pods (PickerPodSelector) is always its own.
	// Zero: podsource.PlanAuto.
	PodWatchPlan podsource.Plan
	// NamespaceWatchThreshold is, for podsource.PlanAuto, the number of
	// served pools from which a namespace is watched once for all of them;
	// it returns to per-pool watches at NamespaceWatchThreshold/2 pools or
	// fewer. Zero: DefaultNamespaceWatchThreshold.
	NamespaceWatchThreshold int
	// StaleEndpointsTimeout is how long a pool whose pods cannot be listed
	// or watched keeps serving the endpoints it last listed; then its
	// requests are refused until its pods are listed again. Zero:
	// podsource.DefaultStaleEndpointsTimeout.
	StaleEndpointsTimeout time.Duration

	// MaxConcurrentReconciles bounds parallel reconciles of pools.
	// Zero: DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// GracefulShutdownTimeout bounds the wait for runnables to stop.
	// Zero: DefaultGracefulShutdownTimeout.
	GracefulShutdownTimeout time.Duration

	// Registerer receives inference_pool_ready_pods, poolpicker_served_pools
	// and the per-pool watch counters. Nil: the metrics are kept but not
	// exported.
	Registerer prometheus.Registerer
	// Logger receives structured logs keyed by pool. Zero: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() {
	if o.PoolName != "" && o.PoolNamespace == "" {
		o.PoolNamespace = DefaultPoolNamespace
	}
	if o.PickerName == "" {
		o.PickerName = DefaultPickerName
	}
	if o.PickerNamespace == "" {
		o.PickerNamespace = DefaultPickerNamespace
	}
	if o.ReplicaName == "" {
		o.ReplicaName = hostReplicaName()
	}
	if o.PickerPodSelector == "" {
		o.PickerPodSelector = PickerLabel + "=" + o.PickerName
	}
	if o.PickerPort == 0 {
		o.PickerPort = DefaultPickerPort
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = min(DefaultRenewDeadline, o.LeaseDuration*2/3)
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = min(DefaultRetryPeriod, o.RenewDeadline/2)
	}
	if o.PodWatchPlan == "" {
		o.PodWatchPlan = podsource.PlanAuto
	}
	if o.NamespaceWatchThreshold <= 0 {
		o.NamespaceWatchThreshold = DefaultNamespaceWatchThreshold
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	if o.GracefulShutdownTimeout <= 0 {
		o.GracefulShutdownTimeout = DefaultGracefulShutdownTimeout
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
}

// Validate reports every option that cannot work, joined, each named as the
// flag an operator would set. The Registry is not checked: it is wiring, not input.
func (o Options) Validate() error {
	var errs []error
	for _, ns := range o.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("watch namespace %q is not a valid namespace name: %s", ns, msgs[0]))
		}
	}
	if o.PoolSelector != "" {
		if _, err := labels.Parse(o.PoolSelector); err != nil {
			errs = append(errs, fmt.Errorf("pool selector %q: %w", o.PoolSelector, err))
		}
	}
	if o.PoolName == "" && o.PoolNamespace != "" {
		errs = append(errs, errors.New("pool namespace is set without a pool name: set the pool name too, or neither"))
	}
	if o.PoolName != "" {
		if msgs := validation.IsDNS1123Subdomain(o.PoolName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("pool name %q is not a valid object name: %s", o.PoolName, msgs[0]))
		}
		ns := o.PoolNamespace
		if ns == "" {
			ns = DefaultPoolNamespace
		}
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("pool namespace %q is not a valid namespace name: %s", ns, msgs[0]))
		}
		if len(o.Namespaces) > 0 && !slices.Contains(o.Namespaces, ns) {
			errs = append(errs, fmt.Errorf("pool %s/%s is outside the watched namespaces %v", ns, o.PoolName, o.Namespaces))
		}
	}
	for _, s := range o.PickerServices {
		if msgs := validation.IsDNS1035Label(s); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("endpoint picker Service name %q is not a valid Service name: %s", s, msgs[0]))
		}
	}
	if o.PickerName != "" {
		if msgs := validation.IsDNS1123Label(o.PickerName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("picker name %q: %s", o.PickerName, msgs[0]))
		}
	}
	if o.ReplicaName != "" {
		if msgs := validation.IsQualifiedName(ReplicaWaitingAnnotationPrefix + o.ReplicaName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("replica name %q: %s", o.ReplicaName, msgs[0]))
		}
	}
	if o.PickerNamespace != "" {
		if msgs := validation.IsDNS1123Label(o.PickerNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("picker namespace %q is not a valid namespace name: %s", o.PickerNamespace, msgs[0]))
		}
	}
	if o.PickerPodSelector != "" {
		if sel, err := labels.Parse(o.PickerPodSelector); err != nil {
			errs = append(errs, fmt.Errorf("picker pod selector %q: %w", o.PickerPodSelector, err))
		} else if sel.Empty() {
			errs = append(errs, fmt.Errorf("picker pod selector %q selects every pod of the namespace", o.PickerPodSelector))
		}
	}
	errs = append(errs, podsource.Options{Plan: o.PodWatchPlan, NamespaceWatchThreshold: o.NamespaceWatchThreshold,
		StaleEndpointsTimeout: o.StaleEndpointsTimeout}.Validate())
	if o.PickerPort < 0 || o.PickerPort > 65535 {
		errs = append(errs, fmt.Errorf("picker port %d: must be 1..65535", o.PickerPort))
	}
	if o.LeaseDuration > 0 && o.RenewDeadline > 0 && o.RenewDeadline >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("leader election renew deadline %s must be shorter than the lease duration %s", o.RenewDeadline, o.LeaseDuration))
	}
	if o.RenewDeadline > 0 && o.RetryPeriod > 0 && o.RetryPeriod >= o.RenewDeadline {
		errs = append(errs, fmt.Errorf("leader election retry period %s must be shorter than the renew deadline %s", o.RetryPeriod, o.RenewDeadline))
	}
	return errors.Join(errs...)
}

// hostReplicaName is the host name (a pod's name) as an annotation name
// allows it: at most 63 characters, starting and ending alphanumerically.
func hostReplicaName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "poolpicker"
	}
	const maxName = 63 // the name part of an annotation key
	if len(host) > maxName {
		host = host[:maxName]
	}
	return strings.Trim(host, "-_.")
}
