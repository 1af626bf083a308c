// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

// Leadership elects, with a Lease, the replica that runs the writers (pool
// claims, picker Services and EndpointSlices, Accepted conditions); every
// replica runs the data plane regardless. It is a runnable on every
// replica: losing the Lease pauses the writers and the replica campaigns
// again, serving all along. Without Options.LeaderElection this process
// leads from Start on.
type Leadership struct {
	// opts are Setup's, defaulted: LeaderElection, the timings and
	// the Lease's name.
	opts        Options
	cfg         *rest.Config
	recorderFor func(name string) record.EventRecorder
	log         logr.Logger
	metrics     *metrics

	leader atomic.Bool
	termMu sync.RWMutex
	// term is the current term as leader; nil off the leader.
	term *term
	// elected wake each writer's reconciler when a term starts, and
	// onElected run then; both are set before Start.
	elected   []chan event.GenericEvent
	onElected []func(ctx context.Context)
}

// electedSource is a channel for a writer's controller on which each new
// term sends one event.
func (l *Leadership) electedSource() chan event.GenericEvent {
	c := make(chan event.GenericEvent, 1)
	l.elected = append(l.elected, c)
	return c
}

// Start campaigns (or, without election, leads) until ctx ends.
func (l *Leadership) Start(ctx context.Context) error {
	if l.opts.LeaderElection {
		return l.elect(ctx)
	}
	l.lead(ctx)
	return nil
}

// NeedLeaderElection is false: the election is this runnable's own.
func (*Leadership) NeedLeaderElection() bool { return false }

// IsLeader reports whether this replica holds the lease.
func (l *Leadership) IsLeader() bool { return l.leader.Load() }

// lead runs one term as leader, until ctx ends: the writers write, and a
// newly elected leader looks at every pool again, so that nothing a
// predecessor left half done (or changed while nobody led) stays so.
func (l *Leadership) lead(ctx context.Context) {
	t := &term{ctx: ctx}
	l.termMu.Lock()
	l.term = t
	l.termMu.Unlock()
	l.leader.Store(true)
	l.metrics.leader.Set(1)
	l.log.Info("elected leader: writing pool claims, picker Services and Accepted conditions", "lease", l.leaseName(), "election", l.opts.LeaderElection)
	for _, c := range l.elected {
		select {
		case c <- event.GenericEvent{Object: &v1.InferencePool{}}:
		default: // one already waiting does the same
		}
	}
	for _, f := range l.onElected {
		f(ctx)
	}
	<-ctx.Done()
	l.termMu.Lock()
	l.term = nil
	l.termMu.Unlock()
	l.leader.Store(false)
	l.metrics.leader.Set(0)
	t.writes.Wait()
	l.log.Info("leadership ended: writes paused", "lease", l.leaseName())
}

// minLockTimeout is the shortest timeout of a Lease request.
const minLockTimeout = time.Second

// term is one stretch of leadership: its context ends when the Lease is
// lost or the manager stops, and writes counts the writes under way, so
// that the Lease is given up only once none is left.
type term struct {
	ctx    context.Context
	writes sync.WaitGroup
}

// leading returns a context for writes that ends with this replica's term
// as leader, and done, to call when they are finished; ok is false off the
// leader (nothing may be written then).
func (l *Leadership) leading(ctx context.Context) (_ context.Context, done func(), ok bool) {
	l.termMu.RLock()
	t := l.term
	if t != nil {
		t.writes.Add(1)
	}
	l.termMu.RUnlock()
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
func (l *Leadership) asLeader(r reconcile.Func) reconcile.Func {
	return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		ctx, done, ok := l.leading(ctx)
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
func (l *Leadership) elect(ctx context.Context) error {
	lock, err := l.newLock()
	if err != nil {
		return err
	}
	ctx = logr.NewContext(ctx, l.log.WithName("leaderelection"))
	for ctx.Err() == nil {
		if err := l.campaign(ctx, lock); err != nil {
			return err
		}
	}
	l.release(lock)
	return nil
}

// campaign waits for the Lease, then leads until it is lost or ctx ends.
func (l *Leadership) campaign(ctx context.Context, lock resourcelock.Interface) error {
	// The elector's context outlives ctx until the term is over, so that
	// renewal goes on while the last writes finish.
	electCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	started := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: l.opts.LeaseDuration,
		RenewDeadline: l.opts.RenewDeadline,
		RetryPeriod:   l.opts.RetryPeriod,
		Name:          l.opts.PickerName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(c context.Context) { started <- c },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != lock.Identity() {
					l.log.Info("another replica leads", "lease", l.leaseName(), "leader", id)
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
		l.lead(termCtx)
		stop()
		end()
		cancel()
		<-ran
		if ctx.Err() == nil {
			l.log.Info("lost the Lease (not renewed within the renew deadline): writes paused, serving goes on; campaigning again",
				"lease", l.leaseName(), "identity", lock.Identity(), "renewDeadline", l.opts.RenewDeadline.String())
		}
	}
	return nil
}

func (l *Leadership) leaseName() string { return l.opts.PickerNamespace + "/" + l.opts.PickerName }

// newLock is the Lease this deployment's replicas elect a leader with, held
// under a unique identity per process.
func (l *Leadership) newLock() (resourcelock.Interface, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election identity: %w", err)
	}
	id := host + "_" + string(uuid.NewUUID())
	cfg := rest.AddUserAgent(rest.CopyConfig(l.cfg), "leader-election")
	// A request that hangs must not use up the whole renew deadline: a
	// slow answer is retried within it, as controller-runtime does.
	cfg.Timeout = max(l.opts.RenewDeadline/2, minLockTimeout)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election client: %w", err)
	}
	coord, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("controllers: leader election client: %w", err)
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, l.opts.PickerNamespace, l.opts.PickerName, core, coord,
		resourcelock.ResourceLockConfig{
			Identity: id,
			// client-go's leader election records its Events with the
			// core Events API.
			EventRecorder: l.recorderFor(id),
		})
}

// release gives the Lease up when this process holds it, so that another
// replica takes over at its next retry rather than when the Lease expires.
// It runs once the last term's writes are over.
func (l *Leadership) release(lock resourcelock.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.RenewDeadline)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil || rec.HolderIdentity != lock.Identity() {
		return
	}
	now := metav1.Now()
	err = lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
	if err != nil {
		l.log.Error(err, "releasing the Lease; another replica takes over when it expires", "lease", l.leaseName())
		return
	}
	l.log.Info("released the Lease", "lease", l.leaseName())
}
