// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"slices"
	"testing"

	"github.com/poolpicker/poolpicker/internal/permissions"
)

// TestNeededRules: the start-up check asks for the rules of the features
// the flags turn on, and for the deployment's own pods whenever something
// follows them (provisioned Services' endpoints, peer sync's peers found
// from the API server), but not for a static --peer-sync-peers list.
func TestNeededRules(t *testing.T) {
	tests := []struct {
		name string
		args []string
		// want are the features whose rules are asked for.
		want []string
	}{
		{"defaults", nil, nil},
		{"leader election", []string{"--ha-enable-leader-election"}, []string{permissions.FeatureLeaderElection}},
		{"provisioning", []string{"--provision-picker-services"}, []string{permissions.FeatureProvisioning}},
		{"peer sync finds its peers from the pods", []string{"--peer-sync"}, []string{permissions.FeaturePeerSync}},
		{"peer sync with a static list", []string{"--peer-sync", "--peer-sync-peers=10.0.0.1:9004,10.0.0.2:9004"}, nil},
		{"as the manifests run it", []string{"--ha-enable-leader-election", "--provision-picker-services", "--peer-sync"},
			[]string{permissions.FeatureProvisioning, permissions.FeaturePeerSync, permissions.FeatureLeaderElection}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			derive(&o, deriveInputs{poolSelectorSet: fs.Changed("pool-selector")})
			var got []string
			for _, r := range neededRules(&o.controllers) {
				for _, f := range r.Features {
					if slices.Contains(tt.want, f) && !slices.Contains(got, f) {
						got = append(got, f)
					}
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("features of the needed rules %v, want %v", got, tt.want)
			}
			pods := false
			for _, r := range neededRules(&o.controllers) {
				if r.Resource == "pods" && r.Scope == permissions.OwnNamespace {
					pods = true
				}
			}
			if wantPods := slices.Contains(tt.want, permissions.FeatureProvisioning) || slices.Contains(tt.want, permissions.FeaturePeerSync); pods != wantPods {
				t.Errorf("own-namespace pods asked for: %v, want %v", pods, wantPods)
			}
		})
	}
}

// TestServedRules: a rule that needs its resource served is asked for only
// where the API server serves it; the others always are.
func TestServedRules(t *testing.T) {
	rules := []permissions.Rule{
		{Group: "", Resource: "pods", Verbs: []string{"list"}},
		{Group: "", Resource: "pods", Verbs: []string{"watch"}, IfServed: "v1"},
		{Group: "", Resource: "nothings", Verbs: []string{"list"}, IfServed: "v1"},
		{Group: "gateway.networking.k8s.io", Resource: "httproutes", Verbs: []string{"list"}, IfServed: "gateway.networking.k8s.io/v1"},
	}
	got, err := servedRules(env.Config, rules)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, r := range got {
		kept = append(kept, r.Resource+"/"+r.Verbs[0])
	}
	// The test's API server has no Gateway API CRDs.
	if want := []string{"pods/list", "pods/watch"}; !slices.Equal(kept, want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
}
