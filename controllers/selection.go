// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

// selection says which InferencePools this picker serves: Options'
// namespace, pool label, single-pool and picker-Service filters, and the
// claims of other deployments. The reconcilers, the initial-sync latch and
// the auto plan's estimate all ask it.
type selection struct {
	poolName, poolNamespace string
	namespaces              []string
	// poolSelector is nil when Options.PoolSelector is empty.
	poolSelector   labels.Selector
	pickerServices []string
	// claimID is the value of ClaimAnnotation for this deployment.
	claimID string
}

// newSelection reads the filters of opts, validated and defaulted.
func newSelection(opts Options) *selection {
	s := &selection{
		poolName: opts.PoolName, poolNamespace: opts.PoolNamespace, namespaces: opts.Namespaces,
		pickerServices: opts.PickerServices, claimID: opts.PickerNamespace + "/" + opts.PickerName,
	}
	if opts.PoolSelector != "" {
		s.poolSelector, _ = labels.Parse(opts.PoolSelector) // validated
	}
	return s
}

// watchesNamespace says whether the picker's caches cover namespace ns.
func (s *selection) watchesNamespace(ns string) bool {
	if s.poolName != "" {
		return ns == s.poolNamespace
	}
	return len(s.namespaces) == 0 || slices.Contains(s.namespaces, ns)
}

// serves says whether this picker serves the pool, and if not, why: the
// pool is for it (servesSpec) and no other deployment claimed it.
func (s *selection) serves(pool *v1.InferencePool) (bool, string) {
	if ok, reason := s.servesSpec(pool); !ok {
		return false, reason
	}
	if other, conflict := s.claimedByOther(pool); conflict {
		return false, fmt.Sprintf("claimed by poolpicker %s (annotation %s), not this deployment %s", other, ClaimAnnotation, s.claimID)
	}
	return true, ""
}

// servesSpec says whether the pool is for this picker on its own terms.
// Namespace, pool label and single-pool filters are applied by the API
// server; they are checked again here so that a pool reaching the
// reconciler some other way is never served by mistake.
func (s *selection) servesSpec(pool *v1.InferencePool) (bool, string) {
	if s.poolName != "" && (pool.Name != s.poolName || pool.Namespace != s.poolNamespace) {
		return false, "not the pool named by the single-pool options"
	}
	if s.poolName == "" && len(s.namespaces) > 0 && !slices.Contains(s.namespaces, pool.Namespace) {
		return false, "namespace not watched"
	}
	if s.poolSelector != nil && !s.poolSelector.Matches(labels.Set(pool.Labels)) {
		return false, "labels do not match the pool selector"
	}
	ref := pool.Spec.EndpointPickerRef
	if ref == nil {
		if len(s.pickerServices) > 0 {
			return false, fmt.Sprintf("spec.endpointPickerRef is unset and this picker serves only pools naming its Services %v", s.pickerServices)
		}
	} else {
		if ref.Group != nil && *ref.Group != "" {
			return false, fmt.Sprintf("spec.endpointPickerRef group %q is not the core group", *ref.Group)
		}
		if ref.Kind != "" && ref.Kind != "Service" {
			return false, fmt.Sprintf("spec.endpointPickerRef kind %q is not Service", ref.Kind)
		}
		if len(s.pickerServices) > 0 && !slices.Contains(s.pickerServices, string(ref.Name)) {
			return false, fmt.Sprintf("spec.endpointPickerRef names Service %q, not one of this picker's %v", ref.Name, s.pickerServices)
		}
	}
	if len(pool.Spec.Selector.MatchLabels) == 0 {
		// An empty selector would watch every pod of the namespace.
		return false, "spec.selector.matchLabels is empty"
	}
	if len(pool.Spec.TargetPorts) == 0 {
		return false, "spec.targetPorts is empty"
	}
	return true, ""
}

// claimedByOther returns the pool's claim and whether another deployment
// holds it.
func (s *selection) claimedByOther(pool *v1.InferencePool) (string, bool) {
	c := pool.Annotations[ClaimAnnotation]
	return c, c != "" && c != s.claimID
}
