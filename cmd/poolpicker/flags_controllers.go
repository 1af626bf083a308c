package main

import (
	"github.com/spf13/pflag"

	"github.com/poolpicker/poolpicker/controllers"
)

func bindControllersFlags(fs *pflag.FlagSet, o *controllers.Options) {
	fs.StringSliceVar(&o.Namespaces, "watch-namespaces", o.Namespaces,
		"Namespaces whose InferencePools (and InferenceObjectives, InferenceModelRewrites) are served, comma-separated or repeated. Empty: all namespaces.")
	fs.StringVar(&o.PoolSelector, "pool-selector", o.PoolSelector,
		`Label selector on InferencePool objects (e.g. "shard=a" or "tier in (gold,silver)"): only matching pools are served, so several poolpicker deployments can split a cluster's pools. Default (no --pool-selector, --pool-name or --epp-service-name): poolpicker.io/picker=<--picker-name>, so a pool opts in with that label. An explicit empty value serves every pool.`)
	fs.StringVar(&o.PoolName, "pool-name", o.PoolName,
		"Serve only this InferencePool (single-pool mode, as the reference EPP). Empty: every pool that passes the other filters.")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", o.PoolNamespace,
		"Namespace of --pool-name. Empty: "+controllers.DefaultPoolNamespace+".")
	fs.StringSliceVar(&o.PickerServices, "epp-service-name", o.PickerServices,
		"Name of a Service this picker is deployed behind, comma-separated or repeated: only pools whose spec.endpointPickerRef names one of them are served. Empty: every pool whose endpointPickerRef is a Service, or unset.")
}
