// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
)

// Endpoint is one target port of one ready pod. Its identity fields are
// immutable; its metrics and in-flight count live in a state shared by every
// snapshot the endpoint appears in, so they survive endpoint-set swaps.
type Endpoint struct {
	// Address is "ip:port", the value sent to the gateway.
	Address string
	// IP is the pod IP.
	IP string
	// Port is the target port.
	Port int32
	// Pod is the namespace/name of the pod.
	Pod types.NamespacedName
	// PodUID tells a recreated pod with the same name apart.
	PodUID types.UID
	// Labels are the pod's labels (shared, never mutated).
	Labels map[string]string

	state *endpointState
}

type endpointState struct {
	metrics atomic.Pointer[Metrics]
	load    load
}

// Key identifies the endpoint across snapshots: the pod UID and the port.
func (e *Endpoint) Key() EndpointKey { return EndpointKey{UID: e.PodUID, Port: e.Port} }

// Metrics returns the latest scrape, or nil when the endpoint was never scraped.
func (e *Endpoint) Metrics() *Metrics { return e.state.metrics.Load() }

// EndpointKey identifies an endpoint: a pod (by UID) and a target port.
type EndpointKey struct {
	UID  types.UID
	Port int32
}

// EndpointSource is what the pool watch knows of a ready pod.
type EndpointSource struct {
	Pod    types.NamespacedName
	UID    types.UID
	IP     string
	Labels map[string]string
}
