// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/internal/version"
)

func bindVersionFlag(fs *pflag.FlagSet, printVersion *bool) {
	fs.BoolVar(printVersion, "version", false, "Print the version and commit, then exit.")
}

// printVersion writes the line of --version.
func printVersion(w io.Writer) {
	fmt.Fprintln(w, version.Get().String())
}

// newBuildInfoGauge is poolpicker_build_info: always 1, its labels carry the
// build identity so dashboards can tell which version each replica runs.
func newBuildInfoGauge() prometheus.Collector {
	info := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "poolpicker_build_info",
		Help: "Always 1; labelled with the version, commit and Go version poolpicker was built with.",
		ConstLabels: prometheus.Labels{
			"version":   info.Version,
			"commit":    info.Commit,
			"goversion": info.GoVersion,
		},
	})
	g.Set(1)
	return g
}

// newExtensionInfoGauge is the upstream EPP's inference_extension_info:
// always 1, labelled commit and build_ref (here the version), so dashboards
// built on upstream's names find it.
func newExtensionInfoGauge() prometheus.Collector {
	info := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "inference_extension_info",
		Help:        "Always 1; labelled with the commit and build ref (version) of the endpoint picker, as upstream's.",
		ConstLabels: prometheus.Labels{"commit": info.Commit, "build_ref": info.Version},
	})
	g.Set(1)
	return g
}
