// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
)

// policyGroups says which API groups of InferenceObjective and
// InferenceModelRewrite the cluster serves: the Inference Extension's
// inference.networking.x-k8s.io (older) and the llm-d router's llm-d.ai
// (current). Both are read when both are there; a group whose CRDs are
// missing is skipped, so a cluster with either works. Decided at start: a
// group installed later is read after a restart.
type policyGroups struct {
	xk8s, llmd bool
}

// detectPolicyGroups asks the API server (through the manager's REST mapper)
// which groups serve both kinds.
func detectPolicyGroups(mapper meta.RESTMapper) (policyGroups, error) {
	has := func(gv schema.GroupVersion) (bool, error) {
		for _, kind := range []string{"InferenceObjective", "InferenceModelRewrite"} {
			if _, err := mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: kind}, gv.Version); err != nil {
				if meta.IsNoMatchError(err) {
					return false, nil
				}
				return false, fmt.Errorf("controllers: looking up %s %s: %w", kind, gv, err)
			}
		}
		return true, nil
	}
	var g policyGroups
	var err error
	if g.xk8s, err = has(v1alpha2.GroupVersion); err != nil {
		return g, err
	}
	if g.llmd, err = has(llmdv1alpha2.GroupVersion); err != nil {
		return g, err
	}
	return g, nil
}

// refersToPoolLLMD is refersToPool for llm-d.ai objects, whose CRDs default
// the group to llm-d.ai: that group names the same InferencePool here.
func refersToPoolLLMD(ref llmdv1alpha2.PoolObjectReference) bool {
	return (ref.Group == "" || string(ref.Group) == v1.GroupVersion.Group || string(ref.Group) == llmdv1alpha2.GroupVersion.Group) &&
		(ref.Kind == "" || ref.Kind == "InferencePool") && ref.Name != ""
}

func poolRefNameLLMD(ref llmdv1alpha2.PoolObjectReference) []string {
	if !refersToPoolLLMD(ref) {
		return nil
	}
	return []string{string(ref.Name)}
}

// policyObject is an objective or rewrite of either group whose Accepted
// condition the policy reconciler sets; conds points into obj.
type policyObject struct {
	obj   client.Object
	conds *[]metav1.Condition
}

// listPolicy lists the objectives and rewrites of both groups that refer to
// the pool key, as inference.networking.x-k8s.io values for buildPolicy
// (llm-d.ai ones last, so they win an objective name defined in both), and
// every object for its condition.
func (r *PolicyReconciler) listPolicy(ctx context.Context, key datastore.PoolKey) ([]v1alpha2.InferenceObjective, []v1alpha2.InferenceModelRewrite, []policyObject, error) {
	c := r.client
	opts := []client.ListOption{client.InNamespace(key.Namespace), client.MatchingFields{poolRefIndex: key.Name}}
	var objectives []v1alpha2.InferenceObjective
	var rewrites []v1alpha2.InferenceModelRewrite
	var objs []policyObject
	if r.groups.xk8s {
		var ol v1alpha2.InferenceObjectiveList
		if err := c.List(ctx, &ol, opts...); err != nil {
			return nil, nil, nil, err
		}
		var rl v1alpha2.InferenceModelRewriteList
		if err := c.List(ctx, &rl, opts...); err != nil {
			return nil, nil, nil, err
		}
		objectives, rewrites = ol.Items, rl.Items
		for i := range ol.Items {
			objs = append(objs, policyObject{&ol.Items[i], &ol.Items[i].Status.Conditions})
		}
		for i := range rl.Items {
			objs = append(objs, policyObject{&rl.Items[i], &rl.Items[i].Status.Conditions})
		}
	}
	if r.groups.llmd {
		var ol llmdv1alpha2.InferenceObjectiveList
		if err := c.List(ctx, &ol, opts...); err != nil {
			return nil, nil, nil, err
		}
		var rl llmdv1alpha2.InferenceModelRewriteList
		if err := c.List(ctx, &rl, opts...); err != nil {
			return nil, nil, nil, err
		}
		for i := range ol.Items {
			o := &ol.Items[i]
			objectives = append(objectives, v1alpha2.InferenceObjective{ObjectMeta: o.ObjectMeta, Spec: v1alpha2.InferenceObjectiveSpec{Priority: o.Spec.Priority}})
			objs = append(objs, policyObject{o, &o.Status.Conditions})
		}
		for i := range rl.Items {
			r := &rl.Items[i]
			rewrites = append(rewrites, v1alpha2.InferenceModelRewrite{ObjectMeta: r.ObjectMeta, Spec: v1alpha2.InferenceModelRewriteSpec{Rules: r.Spec.Rules}})
			objs = append(objs, policyObject{r, &r.Status.Conditions})
		}
	}
	return objectives, rewrites, objs, nil
}
