package main

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
