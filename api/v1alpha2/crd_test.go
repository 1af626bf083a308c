// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1alpha2_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

// create sends obj as raw JSON so tests can express what the Go types cannot.
func create(ctx context.Context, apiVersion, kind, ns, name string, spec map[string]any) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     spec,
	}}
	return env.Client.Create(ctx, u)
}

func TestValidation(t *testing.T) {
	ns := env.Namespace(t, "alpha2")
	target := func(model string, weight any) map[string]any {
		m := map[string]any{"modelRewrite": model}
		if weight != nil {
			m["weight"] = weight
		}
		return m
	}
	rule := func(targets ...any) map[string]any {
		return map[string]any{"matches": []any{map[string]any{"model": map[string]any{"value": "food-review"}}}, "targets": targets}
	}
	pool := map[string]any{"name": "pool-a"}
	cases := []struct {
		name    string
		kind    string
		spec    map[string]any
		wantErr string
	}{
		{name: "objective valid", kind: "InferenceObjective", spec: map[string]any{"priority": -1, "poolRef": pool}},
		{name: "objective without priority", kind: "InferenceObjective", spec: map[string]any{"poolRef": pool}},
		{name: "objective without poolRef", kind: "InferenceObjective", spec: map[string]any{"priority": 1}, wantErr: "spec.poolRef: Required value"},
		{name: "objective poolRef without name", kind: "InferenceObjective", spec: map[string]any{"poolRef": map[string]any{}}, wantErr: "spec.poolRef.name: Required value"},
		{name: "objective poolRef empty name", kind: "InferenceObjective", spec: map[string]any{"poolRef": map[string]any{"name": ""}}, wantErr: "spec.poolRef.name: Invalid value: \"\": spec.poolRef.name in body should be at least 1 chars long"},
		{name: "objective poolRef bad kind", kind: "InferenceObjective", spec: map[string]any{"poolRef": map[string]any{"name": "p", "kind": "Inference Pool"}}, wantErr: "spec.poolRef.kind in body should match '^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$'"},
		{name: "objective poolRef bad group", kind: "InferenceObjective", spec: map[string]any{"poolRef": map[string]any{"name": "p", "group": "Bad_Group"}}, wantErr: "spec.poolRef.group in body should match"},
		{name: "objective priority not integer", kind: "InferenceObjective", spec: map[string]any{"priority": "high", "poolRef": pool}, wantErr: "spec.priority: Invalid value: \"string\": spec.priority in body must be of type integer"},
		{name: "rewrite valid weighted", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(target("a", 90), target("b", 10))}}},
		{name: "rewrite valid unweighted", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(target("a", nil))}}},
		{name: "rewrite without rules", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool}, wantErr: "spec.rules: Required value"},
		{name: "rewrite without poolRef", kind: "InferenceModelRewrite", spec: map[string]any{"rules": []any{rule(target("a", nil))}}, wantErr: "spec.poolRef: Required value"},
		// Upstream's CRDs leave targets optional.
		{name: "rewrite rule without targets", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{map[string]any{"matches": []any{map[string]any{"model": map[string]any{"value": "m"}}}}}}},
		{name: "rewrite rule with empty targets", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule([]any{}...)}}, wantErr: "spec.rules[0].targets: Invalid value: 0: spec.rules[0].targets in body should have at least 1 items"},
		{name: "rewrite negative weight", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(target("a", -5))}}, wantErr: "spec.rules[0].targets[0].weight: Invalid value: -5: spec.rules[0].targets[0].weight in body should be greater than or equal to 1"},
		{name: "rewrite zero weight", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(target("a", 0))}}, wantErr: "spec.rules[0].targets[0].weight in body should be greater than or equal to 1"},
		{name: "rewrite weight too large", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(target("a", 1000001))}}, wantErr: "spec.rules[0].targets[0].weight in body should be less than or equal to 1000000"},
		{name: "rewrite target without model", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{rule(map[string]any{"weight": 1})}}, wantErr: "spec.rules[0].targets[0].modelRewrite: Required value"},
		{name: "rewrite match type not Exact", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{map[string]any{
			"matches": []any{map[string]any{"model": map[string]any{"type": "Prefix", "value": "m"}}}, "targets": []any{target("a", nil)},
		}}}, wantErr: "spec.rules[0].matches[0].model.type: Unsupported value: \"Prefix\": supported values: \"Exact\""},
		{name: "rewrite match without value", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{map[string]any{
			"matches": []any{map[string]any{"model": map[string]any{}}}, "targets": []any{target("a", nil)},
		}}}, wantErr: "spec.rules[0].matches[0].model.value: Required value"},
		{name: "rewrite match without model", kind: "InferenceModelRewrite", spec: map[string]any{"poolRef": pool, "rules": []any{map[string]any{
			"matches": []any{map[string]any{}}, "targets": []any{target("a", nil)},
		}}}, wantErr: "spec.rules[0].matches[0].model: Required value"},
	}
	// The same rules hold in the llm-d router's group.
	for _, gv := range []string{v1alpha2.GroupVersion.String(), "llm-d.ai/v1alpha2"} {
		for i, tc := range cases {
			t.Run(gv+"/"+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err := create(ctx, gv, tc.kind, ns, fmt.Sprintf("%s-case-%d", strings.ReplaceAll(strings.Split(gv, "/")[0], ".", "-"), i), tc.spec)
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("want accepted, got %v", err)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
				}
			})
		}
	}
}

func TestDefaults(t *testing.T) {
	ns := env.Namespace(t, "alpha2-defaults")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obj := &v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "critical"},
		Spec:       v1alpha2.InferenceObjectiveSpec{PoolRef: v1alpha2.PoolObjectReference{Name: "pool-a"}},
	}
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	var got v1alpha2.InferenceObjective
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.PoolRef.Group != "inference.networking.k8s.io" || got.Spec.PoolRef.Kind != "InferencePool" {
		t.Errorf("poolRef defaults: %+v", got.Spec.PoolRef)
	}

	rw := &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "canary"},
		Spec: v1alpha2.InferenceModelRewriteSpec{
			PoolRef: v1alpha2.PoolObjectReference{Name: "pool-a"},
			Rules: []v1alpha2.InferenceModelRewriteRule{{
				Matches: []v1alpha2.Match{{Model: v1alpha2.ModelMatch{Value: "food-review"}}},
				Targets: []v1alpha2.TargetModel{{ModelRewrite: "food-review-v2"}},
			}},
		},
	}
	if err := env.Client.Create(ctx, rw); err != nil {
		t.Fatal(err)
	}
	var gotRW v1alpha2.InferenceModelRewrite
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(rw), &gotRW); err != nil {
		t.Fatal(err)
	}
	if mt := gotRW.Spec.Rules[0].Matches[0].Model.Type; mt == nil || *mt != v1alpha2.MatchExact {
		t.Errorf("match type default = %v, want Exact", mt)
	}
}
