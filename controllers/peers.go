// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// PeerReplicas watches this deployment's own ready pods (PickerPodSelector
// in PickerNamespace) for peer sync: Addresses lists them at
// Options.PeerPort. It runs on every replica.
type PeerReplicas struct {
	key      datastore.PoolKey
	pool     *datastore.Pool
	selector string
	sources  *podsource.Sources
}

func newPeerReplicas(opts Options, sources *podsource.Sources) *PeerReplicas {
	key := datastore.PoolKey{Namespace: opts.PickerNamespace, Name: opts.PickerName + " peers"}
	sel, _ := labels.Parse(opts.PickerPodSelector) // validated
	return &PeerReplicas{key: key, selector: sel.String(), sources: sources,
		pool: datastore.NewRegistry().Upsert(key, &datastore.PoolSpec{TargetPorts: []int32{opts.PeerPort}})}
}

// Start watches the replicas until ctx ends.
func (r *PeerReplicas) Start(ctx context.Context) error {
	stop := r.sources.WatchReplicas(r.key, r.pool, r.selector)
	<-ctx.Done()
	stop()
	return nil
}

// NeedLeaderElection is false: every replica has peers.
func (r *PeerReplicas) NeedLeaderElection() bool { return false }

// Addresses are the ip:port addresses of the ready replicas, this one's
// own included (peer sync tells itself apart); none before the watch has
// listed.
func (r *PeerReplicas) Addresses() []string {
	eps := r.pool.Endpoints().Endpoints
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Address
	}
	return out
}
