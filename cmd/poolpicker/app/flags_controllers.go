// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/controllers/podsource"
)

func bindControllersFlags(fs *pflag.FlagSet, o *controllers.Options) {
	fs.StringSliceVar(&o.Namespaces, "watch-namespaces", o.Namespaces,
		"Namespaces whose InferencePools (and InferenceObjectives, InferenceModelRewrites) are served, comma-separated or repeated. Empty: all namespaces.")
	fs.StringVar(&o.PoolSelector, "pool-selector", o.PoolSelector,
		`Label selector on InferencePool objects (e.g. "shard=a" or "tier in (gold,silver)"): only matching pools are served, so several poolpicker deployments can split a cluster's pools. Default (no --pool-selector, --pool-name or --epp-service-name): poolpicker.io/picker=<--picker-name>, so a pool opts in with that label. An explicit empty value serves every pool.`)
	fs.StringVar(&o.PoolName, "pool-name", o.PoolName,
		"Serve only this InferencePool (single-pool mode, as the reference EPP). Empty: every pool that passes the other filters.")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", o.PoolNamespace,
		"Namespace of --pool-name. Empty: "+controllers.DefaultPoolNamespace+".")
	fs.StringSliceVar(&o.PickerServices, "epp-service-name", o.PickerServices,
		"Name of a Service this picker is deployed behind, comma-separated or repeated: only pools whose spec.endpointPickerRef names one of them are served. Empty: every pool whose endpointPickerRef is a Service, or unset.")
}

func bindPodWatchFlags(fs *pflag.FlagSet, o *controllers.Options) {
	if o.PodWatchPlan == "" {
		o.PodWatchPlan = podsource.PlanAuto
	}
	fs.Var(podWatchPlanValue{&o.PodWatchPlan}, "pod-watch-plan", fmt.Sprintf(
		"How the pods of a namespace's served pools are watched: %s (a watch per pool, scoped by its selector on the API server), %s (one watch of the namespace's pods for all its pools, filtered here) or %s (per namespace: %s from --pod-watch-namespace-threshold pools, %s again at half of it or fewer). A switch keeps each pool on its old watch until the new one has listed, then replaces its endpoints at once.",
		podsource.PlanPerPool, podsource.PlanNamespace, podsource.PlanAuto, podsource.PlanNamespace, podsource.PlanPerPool))
	fs.IntVar(&o.NamespaceWatchThreshold, "pod-watch-namespace-threshold", controllers.DefaultNamespaceWatchThreshold,
		"With --pod-watch-plan=auto, the number of served pools from which a namespace's pods are watched once for all its pools.")
	fs.DurationVar(&o.StaleEndpointsTimeout, "stale-endpoints-timeout", podsource.DefaultStaleEndpointsTimeout,
		"How long a pool whose pods cannot be listed or watched keeps serving the endpoints it last listed; then its requests are answered 503 until its pods are listed again (a deleted pod's address may by then be another pool's).")
}

// podWatchPlanValue refuses an unknown plan when the flag is parsed.
type podWatchPlanValue struct{ p *podsource.Plan }

func (v podWatchPlanValue) String() string {
	if v.p == nil {
		return ""
	}
	return string(*v.p)
}

func (v podWatchPlanValue) Set(s string) error {
	if !slices.Contains(podsource.Plans, podsource.Plan(s)) {
		names := make([]string, len(podsource.Plans))
		for i, p := range podsource.Plans {
			names[i] = string(p)
		}
		return fmt.Errorf("must be one of %s", strings.Join(names, ", "))
	}
	*v.p = podsource.Plan(s)
	return nil
}

func (podWatchPlanValue) Type() string { return "string" }
