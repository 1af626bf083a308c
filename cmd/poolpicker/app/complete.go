// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import "github.com/poolpicker/poolpicker/scheduling"

// completeInputs are what complete reads besides the options.
type completeInputs struct {
	// getenv reads the environment (os.Getenv).
	getenv func(string) string
	// given reports whether a flag was given on the command line (the
	// flag set's Changed): a given flag wins over the config file.
	given func(flag string) bool
	// config is the loaded scheduling config (scheduling.Options.LoadConfig).
	config *scheduling.Config
}

// complete fills in every option value that does not come from the option's
// own flag, in one order: upstream's compat flags (completeCompat), the
// scheduling config's flowControl section for the flags not given
// (applyFlowControlConfig), then the values one component takes from
// another's (derive). It is the one place the command writes option values;
// build later adds only wiring (loggers, registerers, the parts it made). It
// is pure: no flag set, file or cluster. It returns the warnings to log at
// start-up, or why the flags cannot be completed.
func complete(o *options, in completeInputs) (warnings []string, err error) {
	if err := completeCompat(o, in.getenv); err != nil {
		return nil, err
	}
	applyFlowControlConfig(&o.flowControl, in.config.FlowControl, in.given)
	return derive(o, deriveInputs{poolSelectorSet: in.given("pool-selector"), conformancePlugins: in.config.UsesConformanceTestPlugins()}), nil
}
