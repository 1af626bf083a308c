// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/internal/permissions"
)

// preflightTimeout bounds one attempt of the start-up permission check: an
// API server that does not answer in this time is asked again.
const preflightTimeout = 15 * time.Second

// connectGrace is how long start-up waits for the API server's first answer
// before the data plane starts without it: well within a liveness probe's
// tolerance (the chart's: 3 failures 10 s apart).
const connectGrace = 5 * time.Second

// connectBackoff paces the attempts while the API server does not answer.
var connectBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 30 * time.Second}

// connect waits for the API server, then checks the permissions and builds
// the controllers. While the API server does not answer (unreachable,
// timing out, overloaded) it retries with backoff, logging why and holding
// poolpicker_waiting_for_api_server at 1, rather than exiting: a replica
// started during an outage would otherwise crash-loop for all of it. What
// retrying cannot mend (a denied permission, rejected credentials) is
// returned. It calls onUnavailable once, on the first attempt that got no
// answer. It returns nil, nil when ctx ends first.
func (cs *components) connect(ctx context.Context, cfg *rest.Config, o *options, log logr.Logger, onUnavailable func()) (*controllerProcess, error) {
	backoff := connectBackoff
	since := time.Now()
	for attempt := 1; ; attempt++ {
		err := checkPermissions(ctx, cfg, &o.controllers, o.observability.metricsEndpointAuth)
		var c *controllerProcess
		if err == nil {
			c, err = cs.newControllers(cfg, o, log)
		}
		if err == nil {
			cs.waiting.Set(0)
			if attempt > 1 {
				log.Info("the API server answers: starting the controllers", "waited", time.Since(since).Round(time.Millisecond).String(), "attempts", attempt)
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if !apiServerUnavailable(err) {
			return nil, err
		}
		if attempt == 1 {
			onUnavailable()
		}
		cs.waiting.Set(1)
		retry := backoff.Step()
		log.Info("waiting for the API server: not ready until it answers; serving nothing yet", "reason", err.Error(), "attempt", attempt, "retryIn", retry.Round(time.Millisecond).String())
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
	}
}

// apiServerUnavailable reports whether err says that the API server did not
// answer, or could not yet: a transport failure (refused, reset, TLS
// handshake or request timing out) or a status that asks to come back
// later. A denial or a rejected credential is an answer.
func apiServerUnavailable(err error) bool {
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) || utilnet.IsProbableEOF(err) || utilnet.IsConnectionReset(err) || utilnet.IsConnectionRefused(err) {
		return true
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
}

// checkPermissions fails when the API server denies poolpicker any
// permission it needs where it will use it, naming each denied one: without
// it a missing rule shows only as a watch retrying in the logs. The rules of
// a feature that is off are not asked for.
func checkPermissions(ctx context.Context, cfg *rest.Config, o *controllers.Options, metricsAuth bool) error {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	rules, err := servedRules(cfg, neededRules(o))
	if err != nil {
		return err
	}
	if err := permissions.Check(ctx, cfg, rules, permissions.Namespaces{Pools: permissionNamespaces(o), Own: ownNamespace(o)}); err != nil {
		return err
	}
	if !metricsAuth {
		return nil
	}
	// Cluster-scoped: asked for in all namespaces.
	if err := permissions.Check(ctx, cfg, permissions.MetricsAuthRules, permissions.Namespaces{}); err != nil {
		var denied *permissions.Error
		if !errors.As(err, &denied) {
			return err
		}
		return fmt.Errorf("%w\n(or pass --metrics-endpoint-auth=false to serve metrics without authentication)", err)
	}
	return nil
}

// neededRules are the rules of permissions.Rules the enabled features use.
func neededRules(o *controllers.Options) []permissions.Rule {
	return permissions.Needed(permissions.Rules, func(feature string) bool {
		switch feature {
		case permissions.FeatureLeaderElection:
			return o.LeaderElection
		case permissions.FeatureProvisioning:
			return o.ProvisionPickerServices
		case permissions.FeaturePeerSync:
			// Set by derive when the peers come from the API server,
			// not from --peer-sync-peers.
			return o.PeerPort > 0
		}
		return true // a feature this switch does not know: asked for
	})
}

// ownNamespace is the deployment's namespace, as the controllers default it.
func ownNamespace(o *controllers.Options) string {
	if o.PickerNamespace == "" {
		return controllers.DefaultPickerNamespace
	}
	return o.PickerNamespace
}

// permissionNamespaces are the namespaces whose objects poolpicker reads;
// nil means all namespaces.
func permissionNamespaces(o *controllers.Options) []string {
	if o.PoolName != "" {
		if o.PoolNamespace == "" {
			return []string{controllers.DefaultPoolNamespace}
		}
		return []string{o.PoolNamespace}
	}
	return o.Namespaces
}

// servedRules is rules less those whose resource the API server does not
// serve (Rule.IfServed): a picker reads HTTPRoutes only where the Gateway
// API's CRDs are installed, and needs no permission for them elsewhere.
func servedRules(cfg *rest.Config, rules []permissions.Rule) ([]permissions.Rule, error) {
	var dc *discovery.DiscoveryClient
	served := map[string]map[string]bool{}
	out := rules[:0:0]
	for _, r := range rules {
		if r.IfServed == "" {
			out = append(out, r)
			continue
		}
		if served[r.IfServed] == nil {
			if dc == nil {
				var err error
				if dc, err = discovery.NewDiscoveryClientForConfig(cfg); err != nil {
					return nil, err
				}
			}
			list, err := dc.ServerResourcesForGroupVersion(r.IfServed)
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("asking the API server whether it serves %s: %w", r.IfServed, err)
			}
			served[r.IfServed] = map[string]bool{}
			if list != nil {
				for _, res := range list.APIResources {
					served[r.IfServed][res.Name] = true
				}
			}
		}
		if served[r.IfServed][r.Resource] {
			out = append(out, r)
		}
	}
	return out, nil
}
