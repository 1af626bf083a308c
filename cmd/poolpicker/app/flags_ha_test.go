// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"testing"
	"time"
)

// A fresh install serves only pools that opted in: without a serving rule
// of the operator's, the pool selector is the picker's label.
func TestServingIsOptIn(t *testing.T) {
	tests := []struct {
		name         string
		args         []string
		wantSelector string
	}{
		{"defaults", nil, "poolpicker.io/picker=poolpicker"},
		{"picker name", []string{"--picker-name=shard-a"}, "poolpicker.io/picker=shard-a"},
		{"explicit selector", []string{"--pool-selector=tier=gold"}, "tier=gold"},
		{"explicit empty selector serves every pool", []string{"--pool-selector="}, ""},
		{"Service names are a rule of their own", []string{"--epp-service-name=epp"}, ""},
		{"single-pool mode", []string{"--pool-name=p"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			derive(&o, deriveInputs{poolSelectorSet: fs.Changed("pool-selector")})
			if o.controllers.PoolSelector != tt.wantSelector {
				t.Fatalf("pool selector %q, want %q", o.controllers.PoolSelector, tt.wantSelector)
			}
			if err := validate(&o); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHAFlags(t *testing.T) {
	var o options
	fs := newFlagSet(io.Discard, &o)
	err := fs.Parse([]string{"--ha-enable-leader-election", "--provision-picker-services", "--picker-namespace=poolpicker-system",
		"--drain-grace-period=7s", "--drain-timeout=9s", "--bind-address=127.0.0.9", "--grpc-port=9100", "--ha-leader-election-lease-duration=4s"})
	if err != nil {
		t.Fatal(err)
	}
	derive(&o, deriveInputs{poolSelectorSet: fs.Changed("pool-selector")})
	c := o.controllers
	if !c.LeaderElection || !c.ProvisionPickerServices || c.PickerNamespace != "poolpicker-system" || c.PickerPort != 9100 || c.LeaseDuration != 4*time.Second {
		t.Fatalf("controllers options %+v", c)
	}
	if o.extproc.DrainGracePeriod != 7*time.Second || o.extproc.BindAddress != "127.0.0.9" {
		t.Fatalf("extproc grace %s bind %q", o.extproc.DrainGracePeriod, o.extproc.BindAddress)
	}
	if c.GracefulShutdownTimeout < 16*time.Second {
		t.Fatalf("manager shutdown timeout %s leaves no room for the drain", c.GracefulShutdownTimeout)
	}
}
