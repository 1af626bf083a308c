// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
)

func objective(ns, name, pool string, priority *int) *v1alpha2.InferenceObjective {
	return &v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha2.InferenceObjectiveSpec{Priority: priority, PoolRef: v1alpha2.PoolObjectReference{Name: v1.ObjectName(pool)}},
	}
}

func rewrite(ns, name, pool string, rules ...v1alpha2.InferenceModelRewriteRule) *v1alpha2.InferenceModelRewrite {
	return &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha2.InferenceModelRewriteSpec{PoolRef: v1alpha2.PoolObjectReference{Name: v1.ObjectName(pool)}, Rules: rules},
	}
}

func rule(models []string, targets ...v1alpha2.TargetModel) v1alpha2.InferenceModelRewriteRule {
	r := v1alpha2.InferenceModelRewriteRule{Targets: targets}
	for _, m := range models {
		r.Matches = append(r.Matches, v1alpha2.Match{Model: v1alpha2.ModelMatch{Value: m}})
	}
	return r
}

func target(model string, weight *int32) v1alpha2.TargetModel {
	return v1alpha2.TargetModel{ModelRewrite: model, Weight: weight}
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(ctx(t), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// accepted returns the Accepted condition's status and reason.
func accepted(t *testing.T, obj client.Object) (metav1.ConditionStatus, string) {
	t.Helper()
	return acceptedIn(t, env.Client, obj)
}

func (r *running) waitPolicy(t *testing.T, key datastore.PoolKey, want *datastore.Policy) {
	t.Helper()
	r.waitFor(t, fmt.Sprintf("policy of %s = %+v", key, want), func() bool {
		p, ok := r.reg.Get(key)
		return ok && reflect.DeepEqual(p.Policy(), want)
	})
}

func (r *running) waitAccepted(t *testing.T, obj client.Object, status metav1.ConditionStatus, reason string) {
	t.Helper()
	r.waitFor(t, fmt.Sprintf("%s Accepted=%s/%s", obj.GetName(), status, reason), func() bool {
		s, why := accepted(t, obj)
		return s == status && why == reason
	})
}

func TestPolicyPublishedAndAccepted(t *testing.T) {
	ns := env.Namespace(t, "policy")
	r := start(t, nil, Options{Namespaces: []string{ns}})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000})
	r.waitEndpoints(t, key)

	critical := objective(ns, "critical", "pool", ptr.To(10))
	batch := objective(ns, "batch", "pool", ptr.To(-1))
	plain := objective(ns, "plain", "pool", nil)
	canary := rewrite(ns, "a-canary", "pool",
		rule([]string{"llama"}, target("llama-v2", ptr.To[int32](90)), target("llama-v3", ptr.To[int32](10))))
	later := rewrite(ns, "b-later", "pool",
		rule([]string{"llama"}, target("ignored", nil)),
		rule([]string{"mistral", "mistral-7b"}, target("mistral-lora", nil)))
	create(t, critical, batch, plain, canary, later)

	r.waitPolicy(t, key, &datastore.Policy{
		Objectives: map[string]int{"critical": 10, "batch": -1, "plain": 0},
		Rewrites: map[string][]datastore.RewriteTarget{
			"llama":      {{Model: "llama-v2", Weight: 90, Rewrite: "a-canary"}, {Model: "llama-v3", Weight: 10, Rewrite: "a-canary"}},
			"mistral":    {{Model: "mistral-lora", Rewrite: "b-later"}},
			"mistral-7b": {{Model: "mistral-lora", Rewrite: "b-later"}},
		},
	})
	for _, o := range []client.Object{critical, batch, plain, canary, later} {
		r.waitAccepted(t, o, metav1.ConditionTrue, v1alpha2.ReasonAccepted)
	}

	// Updates, a deletion and an objective moved to another pool.
	batch.Spec.Priority = ptr.To(-5)
	if err := env.Client.Update(ctx(t), batch); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx(t), critical); err != nil {
		t.Fatal(err)
	}
	plain.Spec.PoolRef.Name = "elsewhere"
	if err := env.Client.Update(ctx(t), plain); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx(t), canary); err != nil {
		t.Fatal(err)
	}
	r.waitPolicy(t, key, &datastore.Policy{
		Objectives: map[string]int{"batch": -5},
		Rewrites: map[string][]datastore.RewriteTarget{
			"llama":      {{Model: "ignored", Rewrite: "b-later"}},
			"mistral":    {{Model: "mistral-lora", Rewrite: "b-later"}},
			"mistral-7b": {{Model: "mistral-lora", Rewrite: "b-later"}},
		},
	})
	r.waitAccepted(t, plain, metav1.ConditionFalse, v1alpha2.ReasonPoolNotFound)
}

func TestPolicyForMissingPool(t *testing.T) {
	ns := env.Namespace(t, "missing")
	r := start(t, nil, Options{Namespaces: []string{ns}, PickerServices: []string{"epp"}})
	obj := objective(ns, "o", "later", ptr.To(3))
	rw := rewrite(ns, "rw", "later", rule([]string{"a"}, target("b", nil)))
	create(t, obj, rw)
	r.waitAccepted(t, obj, metav1.ConditionFalse, v1alpha2.ReasonPoolNotFound)
	r.waitAccepted(t, rw, metav1.ConditionFalse, v1alpha2.ReasonPoolNotFound)

	// The pool appears: the same objects become accepted and its policy is published.
	key := datastore.PoolKey{Namespace: ns, Name: "later"}
	createPool(t, ns, "later", map[string]string{"app": "m"}, []int32{8000})
	r.waitPolicy(t, key, &datastore.Policy{Objectives: map[string]int{"o": 3}, Rewrites: map[string][]datastore.RewriteTarget{"a": {{Model: "b", Rewrite: "rw"}}}})
	r.waitAccepted(t, obj, metav1.ConditionTrue, v1alpha2.ReasonAccepted)
	r.waitAccepted(t, rw, metav1.ConditionTrue, v1alpha2.ReasonAccepted)

	// A pool that exists but that another picker serves: its objects are
	// left to that picker. The policy reconciler has one worker and a FIFO
	// queue, so once the later deletion is reported, theirs was handled.
	createPool(t, ns, "theirs", map[string]string{"app": "m"}, []int32{8000}, withPicker("their-epp", 9002))
	theirs := objective(ns, "theirs-o", "theirs", nil)
	create(t, theirs)
	deletePool(t, key)
	r.waitAccepted(t, obj, metav1.ConditionFalse, v1alpha2.ReasonPoolNotFound)
	if s, _ := accepted(t, theirs); s != "" {
		t.Fatalf("the objective of a pool served elsewhere got Accepted=%s from this picker", s)
	}
}

func TestBuildPolicy(t *testing.T) {
	at := func(sec int64) metav1.Time { return metav1.NewTime(time.Unix(sec, 0)) }
	prefix := v1alpha2.MatchType("Prefix")
	newer := rewrite("ns", "a-newer", "p", rule([]string{"m"}, target("from-newer", nil)))
	newer.CreationTimestamp = at(200)
	older := rewrite("ns", "z-older", "p", rule([]string{"m"}, target("from-older", ptr.To[int32](5))), rule([]string{"m", "n"}, target("second-rule", nil)))
	older.CreationTimestamp = at(100)
	nonExact := rewrite("ns", "prefix", "p", v1alpha2.InferenceModelRewriteRule{
		Matches: []v1alpha2.Match{{Model: v1alpha2.ModelMatch{Type: &prefix, Value: "q"}}},
		Targets: []v1alpha2.TargetModel{target("never", nil)},
	})
	cases := []struct {
		name       string
		objectives []v1alpha2.InferenceObjective
		rewrites   []v1alpha2.InferenceModelRewrite
		want       *datastore.Policy
	}{
		{name: "empty", want: &datastore.Policy{Objectives: map[string]int{}, Rewrites: map[string][]datastore.RewriteTarget{}}},
		{name: "objectives, unset priority is 0",
			objectives: []v1alpha2.InferenceObjective{*objective("ns", "a", "p", ptr.To(-2)), *objective("ns", "b", "p", nil)},
			want:       &datastore.Policy{Objectives: map[string]int{"a": -2, "b": 0}, Rewrites: map[string][]datastore.RewriteTarget{}}},
		{name: "oldest object wins, then first rule; non-exact matches ignored",
			rewrites: []v1alpha2.InferenceModelRewrite{*newer, *nonExact, *older},
			want: &datastore.Policy{Objectives: map[string]int{}, Rewrites: map[string][]datastore.RewriteTarget{
				"m": {{Model: "from-older", Weight: 5, Rewrite: "z-older"}},
				"n": {{Model: "second-rule", Rewrite: "z-older"}},
			}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildPolicy(tc.objectives, tc.rewrites); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("buildPolicy = %+v, want %+v", got, tc.want)
			}
		})
	}
}
