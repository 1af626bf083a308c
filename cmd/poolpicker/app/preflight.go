package app

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"

	"github.com/poolpicker/poolpicker/controllers"
	"github.com/poolpicker/poolpicker/internal/permissions"
)

// preflightTimeout bounds the start-up permission check; an API server that
// does not answer in this time fails start-up rather than stalling it.
const preflightTimeout = 30 * time.Second

// checkPermissions fails when the API server denies poolpicker any
// permission it needs where it will use it, naming each denied one: without
// it a missing rule shows only as a watch retrying in the logs. The rules of
// a feature that is off are not asked for.
func checkPermissions(ctx context.Context, cfg *rest.Config, o *controllers.Options, metricsAuth bool) error {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	if err := permissions.Check(ctx, cfg, neededRules(o), permissions.Namespaces{Pools: permissionNamespaces(o), Own: ownNamespace(o)}); err != nil {
		return err
	}
	if !metricsAuth {
		return nil
	}
	// Cluster-scoped: asked for in all namespaces.
	if err := permissions.Check(ctx, cfg, permissions.MetricsAuthRules, permissions.Namespaces{}); err != nil {
		return fmt.Errorf("%w\n(or pass --metrics-endpoint-auth=false to serve metrics without authentication)", err)
	}
	return nil
}

// neededRules are the rules of permissions.Rules the enabled features use.
func neededRules(o *controllers.Options) []permissions.Rule {
	return permissions.Needed(permissions.Rules, func(feature string) bool {
		switch feature {
		case permissions.FeatureLeaderElection:
			return o.LeaderElection
		case permissions.FeatureProvisioning:
			return o.ProvisionPickerServices
		}
		return true // a feature this switch does not know: asked for
	})
}

// ownNamespace is the deployment's namespace, as the controllers default it.
func ownNamespace(o *controllers.Options) string {
	if o.PickerNamespace == "" {
		return controllers.DefaultPickerNamespace
	}
	return o.PickerNamespace
}

// permissionNamespaces are the namespaces whose objects poolpicker reads;
// nil means all namespaces.
func permissionNamespaces(o *controllers.Options) []string {
	if o.PoolName != "" {
		if o.PoolNamespace == "" {
			return []string{controllers.DefaultPoolNamespace}
		}
		return []string{o.PoolNamespace}
	}
	return o.Namespaces
}
