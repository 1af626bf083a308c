// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"testing"
	"time"
)

// TestDerive: every value one component takes from another's options, from
// flags as an operator gives them.
func TestDerive(t *testing.T) {
	type derived struct {
		poolSelector         string
		pickerPort           int32
		shutdownTimeout      time.Duration
		drainGrace           time.Duration
		bindAddress          string
		conformanceBehaviors bool
		conformanceFilter    bool
		schedulerStaleness   time.Duration
		warnings             int
	}
	tests := []struct {
		name               string
		args               []string
		conformancePlugins bool
		want               derived
	}{
		{"defaults", nil, false, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9002, shutdownTimeout: 5*time.Second + 30*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, bindAddress: "", schedulerStaleness: 2 * time.Second,
		}},
		{"picker name labels the default selection", []string{"--picker-name=shard-a"}, false, derived{
			poolSelector: "poolpicker.io/picker=shard-a", pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second,
		}},
		{"explicit empty selector serves every pool", []string{"--pool-selector="}, false, derived{
			pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin, drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second,
		}},
		{"single-pool mode has no default selector", []string{"--pool-name=p"}, false, derived{
			pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin, drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second,
		}},
		{"Service names have no default selector", []string{"--epp-service-name=epp"}, false, derived{
			pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin, drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second,
		}},
		{"ports, drain and bind address", []string{"--grpc-port=9100", "--drain-grace-period=7s", "--drain-timeout=9s", "--bind-address=127.0.0.9"}, false, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9100, shutdownTimeout: 16*time.Second + shutdownMargin,
			drainGrace: 7 * time.Second, bindAddress: "127.0.0.9", schedulerStaleness: 2 * time.Second,
		}},
		{"the scraper's staleness is the scheduler's", []string{"--metrics-staleness-threshold=5s"}, false, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, schedulerStaleness: 5 * time.Second,
		}},
		{"the conformance flag turns the filter on", []string{"--enable-conformance-test-behaviors"}, false, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second, conformanceBehaviors: true, conformanceFilter: true,
		}},
		{"conformance plugins turn both on, with a warning", nil, true, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second, conformanceBehaviors: true, conformanceFilter: true, warnings: 1,
		}},
		{"conformance plugins with the flag: no warning", []string{"--enable-conformance-test-behaviors"}, true, derived{
			poolSelector: "poolpicker.io/picker=poolpicker", pickerPort: 9002, shutdownTimeout: 35*time.Second + shutdownMargin,
			drainGrace: 5 * time.Second, schedulerStaleness: 2 * time.Second, conformanceBehaviors: true, conformanceFilter: true,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o options
			fs := newFlagSet(io.Discard, &o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			warnings := derive(&o, deriveInputs{poolSelectorSet: fs.Changed("pool-selector"), conformancePlugins: tt.conformancePlugins})
			got := derived{
				poolSelector: o.controllers.PoolSelector, pickerPort: o.controllers.PickerPort, shutdownTimeout: o.controllers.GracefulShutdownTimeout,
				drainGrace: o.extproc.DrainGracePeriod, bindAddress: o.extproc.BindAddress,
				conformanceBehaviors: o.extproc.EnableConformanceTestBehaviors, conformanceFilter: o.scheduling.EnableConformanceTestFilter,
				schedulerStaleness: o.scheduling.MetricsStaleness, warnings: len(warnings),
			}
			if got != tt.want {
				t.Errorf("derived %+v\nwant    %+v", got, tt.want)
			}
			if err := validate(&o); err != nil {
				t.Errorf("derived options do not validate: %v", err)
			}
		})
	}
}
