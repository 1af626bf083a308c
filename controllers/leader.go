// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// minLockTimeout is the shortest timeout of a Lease request.
const minLockTimeout = time.Second

// term is one stretch of leadership: its context ends when the Lease is
// lost or the Manager stops, and writes counts the writes under way, so
// that the Lease is given up only once none is left.
type term struct {
	ctx    context.Context
	writes sync.WaitGroup
}

// leading returns a context for writes that ends with this replica's term
// as leader, and done, to call when they are finished; ok is false off the
// leader (nothing may be written then).
func (m *Manager) leading(ctx context.Context) (_ context.Context, done func(), ok bool) {
	m.termMu.RLock()
	t := m.term
	if t != nil {
		t.writes.Add(1)
	}
	m.termMu.RUnlock()
	if t == nil {
		return ctx, func() {}, false
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	return ctx, func() { stop(); cancel(); t.writes.Done() }, true
}

// asLeader makes r a writer: it runs only on the leader, and what it writes
// is cut off when the term ends. Off the leader a request is dropped: a
// newly elected leader enqueues every pool again (electedRequests).
func (m *Manager) asLeader(r reconcile.Func) reconcile.Func {
	return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		ctx, done, ok := m.leading(ctx)
		defer done()
		if !ok {
			return reconcile.Result{}, nil
		}
		res, err := r(ctx, req)
		if ctx.Err() != nil {
			return reconcile.Result{}, nil // the term ended: the next leader redoes it
		}
		return res, err
	}
}

// elect campaigns for the Lease until ctx ends, leading (lead) while it
// holds it. Losing the Lease (the API server unreachable for RenewDeadline)
// ends the term, which pauses the writers, and the replica campaigns again,
// serving all along: controller-runtime's own election would exit the
// process instead, taking every pool's serving down with the writers.
// When ctx ends, the Lease is released once the term's writes are over.
func (m *Manager) elect(ctx context.Context) error {
	lock, err := m.newLock()
	if err != nil {
		return err
	}
	ctx = logr.NewContext(ctx, m.log.WithName("leaderelection"))
	for ctx.Err() == nil {
		if err := m.campaign(ctx, lock); err != nil {
			return err
		}
	}
	m.release(lock)
	return nil
}

// campaign waits for the Lease, then leads until it is lost or ctx ends.
func (m *Manager) campaign(ctx context.Context, lock resourcelock.Interface) error {
	// The elector's context outlives ctx until the term is over, so that
	// renewal goes on while the last writes finish.
	electCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	started := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: m.opts.LeaseDuration,
		RenewDeadline: m.opts.RenewDeadline,
		RetryPeriod:   m.opts.RetryPeriod,
		Name:          m.opts.PickerName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(c context.Context) { started <- c },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != lock.Identity() {
					m.log.Info("another replica leads", "lease", m.leaseName(), "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("controllers: leader election: %w", err)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		le.Run(electCtx)
	}()
	select {
	case <-ctx.Done():
		cancel()
		<-ran
	case <-ran:
	case termCtx := <-started:
		termCtx, end := context.WithCancel(termCtx)
		stop := context.AfterFunc(ctx, end)
		m.lead(termCtx)
		stop()
		end()
		cancel()
		<-ran
		if ctx.Err() == nil {
			m.log.Info("lost the Lease (not renewed within the renew deadline): writes paused, serving goes on; campaigning again",
				"lease", m.leaseName(), "identity", lock.Identity(), "renewDeadline", m.opts.RenewDeadline.String())
		}
	}
	return nil
}

func (m *Manager) leaseName() string { return m.opts.PickerNamespace + "/" + m.opts.PickerName }

// newLock is the Lease this deployment's replicas elect a leader with, held
// under a unique identity per process.
func (m *Manager) newLock() (resourcelock.Interface, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election identity: %w", err)
	}
	id := host + "_" + string(uuid.NewUUID())
	cfg := rest.AddUserAgent(rest.CopyConfig(m.mgr.GetConfig()), "leader-election")
	// A request that hangs must not use up the whole renew deadline: a
	// slow answer is retried within it, as controller-runtime does.
	cfg.Timeout = max(m.opts.RenewDeadline/2, minLockTimeout)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election client: %w", err)
	}
	coord, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election client: %w", err)
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, m.opts.PickerNamespace, m.opts.PickerName, core, coord,
		resourcelock.ResourceLockConfig{
			Identity: id,
			// client-go's leader election records its Events with the
			// core Events API.
			EventRecorder: m.mgr.GetEventRecorderFor(id), //nolint:staticcheck
		})
}

// release gives the Lease up when this process holds it, so that another
// replica takes over at its next retry rather than when the Lease expires.
// It runs once the last term's writes are over.
func (m *Manager) release(lock resourcelock.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.RenewDeadline)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil || rec.HolderIdentity != lock.Identity() {
		return
	}
	now := metav1.Now()
	err = lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
	if err != nil {
		m.log.Error(err, "releasing the Lease; another replica takes over when it expires", "lease", m.leaseName())
		return
	}
	m.log.Info("released the Lease", "lease", m.leaseName())
}
