// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// InitialSync is the latch readiness waits for: it is a runnable that, once
// the pool cache has synced, waits until every pool served at start is in
// the registry and its pods have been listed once (or failed to be, which
// is reported on the pool on its own), then sets HasSynced.
type InitialSync struct {
	cache     cache.Cache
	selection *selection
	registry  *datastore.Registry
	sources   *podsource.Sources
	log       logr.Logger
	// progressInterval paces the progress lines. Zero:
	// DefaultStartupProgressInterval.
	progressInterval time.Duration

	synced atomic.Bool
	// changed is poked when a pool syncs or stops being served, waking
	// Start.
	changed chan struct{}
}

// HasSynced reports whether every pool served at start has synced: until
// then an empty or partial registry is not yet the truth. Once true it
// stays true; a pool added later reports its own Pool.Synced.
func (s *InitialSync) HasSynced() bool { return s.synced.Load() }

// NeedLeaderElection is false: every replica serves.
func (*InitialSync) NeedLeaderElection() bool { return false }

func (s *InitialSync) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Start latches HasSynced once the pools in the cache at start are all in
// the registry and synced, or returns when ctx ends first.
func (s *InitialSync) Start(ctx context.Context) error {
	if !s.cache.WaitForCacheSync(ctx) {
		return nil // stopping
	}
	var list v1.InferencePoolList
	if err := s.cache.List(ctx, &list); err != nil {
		return fmt.Errorf("controllers: listing pools: %w", err)
	}
	want := map[datastore.PoolKey]bool{}
	for i := range list.Items {
		if ok, _ := s.selection.serves(&list.Items[i]); ok {
			want[datastore.PoolKey{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}] = true
		}
	}
	total := len(want)
	s.log.Info("waiting for the pod watches of the served pools to sync", "pools", total)
	progress := time.NewTicker(s.progressEvery())
	defer progress.Stop()
	for {
		done := true
		for key := range want {
			p, ok := s.registry.Get(key)
			// A pool whose pods cannot be listed is reported and refused
			// on its own; it does not hold readiness back.
			if ok && (p.Synced() || p.SyncError() != "") {
				delete(want, key)
				continue
			}
			if !ok && !s.sources.IsServed(key) && !s.inCache(ctx, key) {
				delete(want, key) // deleted or no longer served since
				continue
			}
			// One pool left is enough to wait again; the rest are looked at
			// on later wake-ups. Looking at all of them on each one (a cache
			// read each) made a start with thousands of pools quadratic.
			done = false
			break
		}
		if done {
			s.synced.Store(true)
			s.log.Info("all served pools synced", "pools", s.registry.Len())
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		case <-progress.C:
			// Counted by the registry: a pool is synced or reported failing
			// whether or not this loop has looked at it yet.
			synced, failing := s.progress(want)
			s.log.Info("pools synced", "synced", total-len(want)+synced, "failing", failing, "of", total)
		}
	}
}

// DefaultStartupProgressInterval is how often, during the initial sync, a
// line says how many of the pools served at start have synced.
const DefaultStartupProgressInterval = 5 * time.Second

func (s *InitialSync) progressEvery() time.Duration {
	if s.progressInterval > 0 {
		return s.progressInterval
	}
	return DefaultStartupProgressInterval
}

// progress counts the pools of want that have synced, or failed, since
// Start last looked at them.
func (s *InitialSync) progress(want map[datastore.PoolKey]bool) (synced, failing int) {
	for key := range want {
		if p, ok := s.registry.Get(key); ok {
			switch {
			case p.Synced():
				synced++
			case p.SyncError() != "":
				failing++
			}
		}
	}
	return synced, failing
}

func (s *InitialSync) inCache(ctx context.Context, key datastore.PoolKey) bool {
	var pool v1.InferencePool
	if err := s.cache.Get(ctx, key, &pool); err != nil {
		return false
	}
	ok, _ := s.selection.serves(&pool)
	return ok
}
