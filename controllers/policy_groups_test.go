// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

func llmdObjective(ns, name, pool string, priority *int) *llmdv1alpha2.InferenceObjective {
	return &llmdv1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       llmdv1alpha2.InferenceObjectiveSpec{Priority: priority, PoolRef: llmdv1alpha2.PoolObjectReference{Name: v1.ObjectName(pool)}},
	}
}

func llmdRewrite(ns, name, pool string, rules ...v1alpha2.InferenceModelRewriteRule) *llmdv1alpha2.InferenceModelRewrite {
	return &llmdv1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       llmdv1alpha2.InferenceModelRewriteSpec{PoolRef: llmdv1alpha2.PoolObjectReference{Name: v1.ObjectName(pool)}, Rules: rules},
	}
}

// acceptedIn is accepted for objects of either group, read through c.
func acceptedIn(t *testing.T, c client.Client, obj client.Object) (metav1.ConditionStatus, string) {
	t.Helper()
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatalf("get %s: %v", obj.GetName(), err)
	}
	var conds []metav1.Condition
	switch o := obj.(type) {
	case *v1alpha2.InferenceObjective:
		conds = o.Status.Conditions
	case *v1alpha2.InferenceModelRewrite:
		conds = o.Status.Conditions
	case *llmdv1alpha2.InferenceObjective:
		conds = o.Status.Conditions
	case *llmdv1alpha2.InferenceModelRewrite:
		conds = o.Status.Conditions
	}
	c0 := meta.FindStatusCondition(conds, v1alpha2.ConditionAccepted)
	if c0 == nil || c0.ObservedGeneration != obj.GetGeneration() {
		return "", ""
	}
	return c0.Status, c0.Reason
}

// TestPolicyBothGroups: with both groups' CRDs installed, objectives and
// rewrites of both are published together; an llm-d.ai objective wins a name
// both define, and llm-d.ai objects whose poolRef group defaults to llm-d.ai
// refer to the InferencePool.
func TestPolicyBothGroups(t *testing.T) {
	ns := env.Namespace(t, "groups")
	r := start(t, nil, Options{Namespaces: []string{ns}})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000})
	r.waitEndpoints(t, key)

	old := objective(ns, "shared", "pool", ptr.To(1))
	cur := llmdObjective(ns, "shared", "pool", ptr.To(7))
	batch := llmdObjective(ns, "batch", "pool", ptr.To(-3))
	explicit := llmdObjective(ns, "explicit", "pool", ptr.To(2))
	explicit.Spec.PoolRef.Group = v1.Group(v1.GroupVersion.Group)
	// A rule without targets is valid upstream (targets are optional).
	rw := llmdRewrite(ns, "rw", "pool", v1alpha2.InferenceModelRewriteRule{Matches: []v1alpha2.Match{{Model: v1alpha2.ModelMatch{Value: "none"}}}},
		rule([]string{"llama"}, target("llama-lora", nil)))
	xrw := rewrite(ns, "xrw", "pool", rule([]string{"mistral"}, target("mistral-lora", nil)))
	create(t, old, cur, batch, explicit, rw, xrw)

	r.waitPolicy(t, key, &datastore.Policy{
		Objectives: map[string]int{"shared": 7, "batch": -3, "explicit": 2},
		Rewrites: map[string][]datastore.RewriteTarget{
			"llama":   {{Model: "llama-lora", Rewrite: "rw"}},
			"mistral": {{Model: "mistral-lora", Rewrite: "xrw"}},
		},
	})
	if string(cur.Spec.PoolRef.Group) != llmdv1alpha2.GroupVersion.Group {
		t.Errorf("llm-d.ai poolRef group defaulted to %q, want llm-d.ai as upstream", cur.Spec.PoolRef.Group)
	}
	for _, o := range []client.Object{old, cur, batch, explicit, rw, xrw} {
		r.waitFor(t, fmt.Sprintf("%T %s accepted", o, o.GetName()), func() bool {
			s, why := acceptedIn(t, env.Client, o)
			return s == metav1.ConditionTrue && why == v1alpha2.ReasonAccepted
		})
	}
}

// TestPolicyOneGroup runs a control plane with only one group's CRDs each
// time: the picker serves, and reads the objectives of the group there is.
func TestPolicyOneGroup(t *testing.T) {
	cases := []struct {
		name string
		omit []string
		objs func(ns string) []client.Object
	}{
		{name: "llm-d.ai only", omit: []string{"inference.networking.x-k8s.io_inferenceobjectives.yaml", "inference.networking.x-k8s.io_inferencemodelrewrites.yaml"},
			objs: func(ns string) []client.Object {
				return []client.Object{llmdObjective(ns, "o", "pool", ptr.To(4)), llmdRewrite(ns, "rw", "pool", rule([]string{"a"}, target("b", nil)))}
			}},
		{name: "inference.networking.x-k8s.io only", omit: []string{"llm-d.ai_inferenceobjectives.yaml", "llm-d.ai_inferencemodelrewrites.yaml"},
			objs: func(ns string) []client.Object {
				return []client.Object{objective(ns, "o", "pool", ptr.To(4)), rewrite(ns, "rw", "pool", rule([]string{"a"}, target("b", nil)))}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bases := filepath.Join(env.Root, "config", "crd", "bases")
			entries, err := os.ReadDir(bases)
			if err != nil {
				t.Fatal(err)
			}
			var crds []string
			for _, f := range entries {
				if !slices.Contains(tc.omit, f.Name()) {
					crds = append(crds, filepath.Join(bases, f.Name()))
				}
			}
			e, err := testenv.Start(testenv.Options{CRDDirs: crds})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := e.Stop(); err != nil {
					t.Error(err)
				}
			}()
			const ns = "default"
			r := start(t, e.Config, Options{Namespaces: []string{ns}})
			defer r.stop(t)
			pool := newPool(ns, "pool", map[string]string{"app": "m"}, []int32{8000})
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m", Labels: map[string]string{"app": "m"}}, Spec: podSpec()}
			objs := append([]client.Object{pool, pod}, tc.objs(ns)...)
			for _, o := range objs {
				if err := e.Client.Create(ctx(t), o); err != nil {
					t.Fatalf("create %T: %v", o, err)
				}
			}
			r.waitPolicy(t, datastore.PoolKey{Namespace: ns, Name: "pool"}, &datastore.Policy{
				Objectives: map[string]int{"o": 4}, Rewrites: map[string][]datastore.RewriteTarget{"a": {{Model: "b", Rewrite: "rw"}}}})
			for _, o := range objs[2:] {
				r.waitFor(t, o.GetName()+" accepted", func() bool {
					s, _ := acceptedIn(t, e.Client, o)
					return s == metav1.ConditionTrue
				})
			}
		})
	}
}
