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
			for _, r := range neededRules(&o.controllers, true) {
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
			for _, r := range neededRules(&o.controllers, true) {
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
