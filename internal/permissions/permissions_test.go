// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package permissions_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/permissions"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

// bind grants the ServiceAccount ns/name a ClusterRole of rules (named
// after the account and role), cluster-wide or, when roleNS is set, only in
// that namespace.
func bind(t *testing.T, ctx context.Context, ns, name, roleName, roleNS string, rules []rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name + "-" + roleName}, Rules: rules}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), role) })
	if roleNS == "" {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name}, RoleRef: ref, Subjects: subject}
		if err := env.Client.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), b) })
		return
	}
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: roleNS, Name: role.Name}, RoleRef: ref, Subjects: subject}
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// grant binds the rules as the manifests do, leaving out one verb
// (skipRule -1: none): the PoolNamespaces rules in poolNS, the OwnNamespace
// rules in ownNS.
func grant(t *testing.T, ctx context.Context, ns, name, poolNS, ownNS string, skipRule int, skipVerb string) {
	t.Helper()
	bind(t, ctx, ns, name, "pools", poolNS, deploytest.PolicyRulesWithout(permissions.Rules, permissions.PoolNamespaces, skipRule, skipVerb))
	bind(t, ctx, ns, name, "own", ownNS, deploytest.PolicyRulesWithout(permissions.Rules, permissions.OwnNamespace, skipRule, skipVerb))
}

// TestCheckNamesEachMissingVerb grants a ServiceAccount every rule but one
// verb, for each verb of each rule in turn: Check must name exactly that
// verb, its resource, group, reason and namespace, and the account. The
// pool rules are bound in one namespace and the deployment's own in
// another, so that a verb both scopes grant (pods) is missed in one only.
func TestCheckNamesEachMissingVerb(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := env.Namespace(t, "perm")
	pools, own := env.Namespace(t, "perm-pools"), env.Namespace(t, "perm-own")
	where := permissions.Namespaces{Pools: []string{pools}, Own: own}

	t.Run("all granted", func(t *testing.T) {
		grant(t, ctx, ns, "full", pools, own, -1, "")
		cfg, err := env.ServiceAccountConfig(ctx, ns, "full")
		if err != nil {
			t.Fatal(err)
		}
		if err := permissions.Check(ctx, cfg, permissions.Rules, where); err != nil {
			t.Fatalf("Check with every rule granted: %v", err)
		}
	})

	n := 0
	for i, r := range permissions.Rules {
		deniedIn := pools
		if r.Scope == permissions.OwnNamespace {
			deniedIn = own
		}
		for _, verb := range r.Verbs {
			n++
			name := fmt.Sprintf("minus-%d-%s", i, verb)
			t.Run(name, func(t *testing.T) {
				grant(t, ctx, ns, name, pools, own, i, verb)
				cfg, err := env.ServiceAccountConfig(ctx, ns, name)
				if err != nil {
					t.Fatal(err)
				}
				err = permissions.Check(ctx, cfg, permissions.Rules, where)
				var perr *permissions.Error
				if !errors.As(err, &perr) {
					t.Fatalf("Check = %v, want a permissions *permissions.Error", err)
				}
				if len(perr.Denied) != 1 || perr.Denied[0].Verb != verb || perr.Denied[0].Rule.Resource != r.Resource {
					t.Fatalf("denied %v, want only %s %s", perr.Denied, verb, r.Resource)
				}
				msg := err.Error()
				for _, want := range []string{verb + " " + r.Resource, r.Why, "system:serviceaccount:" + ns + ":" + name, `in namespace "` + deniedIn + `"`} {
					if !strings.Contains(msg, want) {
						t.Errorf("message lacks %q:\n%s", want, msg)
					}
				}
			})
		}
	}
	if n < 8 {
		t.Errorf("only %d verbs checked; the rule table shrank?", n)
	}
}

// TestNeeded: the rules of a feature that is off are left out, the others
// kept in order.
func TestNeeded(t *testing.T) {
	tests := []struct {
		name string
		on   []string
		want []string // group/resource of the feature rules kept
	}{
		{"both off", nil, nil},
		{"leader election", []string{permissions.FeatureLeaderElection}, []string{"coordination.k8s.io/leases", "/events"}},
		{"provisioning", []string{permissions.FeatureProvisioning}, []string{"/services", "discovery.k8s.io/endpointslices", "/pods"}},
		{"peer sync", []string{permissions.FeaturePeerSync}, []string{"/pods"}},
		{"provisioning and peer sync", []string{permissions.FeatureProvisioning, permissions.FeaturePeerSync}, []string{"/services", "discovery.k8s.io/endpointslices", "/pods"}},
	}
	always := 0
	for _, r := range permissions.Rules {
		if len(r.Features) == 0 {
			always++
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := permissions.Needed(permissions.Rules, func(f string) bool { return slices.Contains(tt.on, f) })
			if len(got) != always+len(tt.want) {
				t.Fatalf("%d rules, want %d always needed and %v", len(got), always, tt.want)
			}
			var feature []string
			for _, r := range got {
				if len(r.Features) > 0 {
					feature = append(feature, r.Group+"/"+r.Resource)
				}
			}
			if !slices.Equal(feature, tt.want) {
				t.Errorf("feature rules %v, want %v", feature, tt.want)
			}
		})
	}
}

// TestCheckPerNamespace grants the rules only in one namespace: a check of
// that namespace passes, a check of another (or of all namespaces) names the
// namespace it was denied in.
func TestCheckPerNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	granted, other := env.Namespace(t, "perm-in"), env.Namespace(t, "perm-out")
	grant(t, ctx, granted, "scoped", granted, granted, -1, "")
	cfg, err := env.ServiceAccountConfig(ctx, granted, "scoped")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		namespaces []string
		wantIn     string // "" means allowed
	}{
		{[]string{granted}, ""},
		{[]string{granted, other}, `in namespace "` + other + `"`},
		{nil, "in all namespaces"},
	}
	for _, tt := range tests {
		err := permissions.Check(ctx, cfg, permissions.Rules, permissions.Namespaces{Pools: tt.namespaces, Own: granted})
		switch {
		case tt.wantIn == "" && err != nil:
			t.Errorf("Check(%v) = %v, want allowed", tt.namespaces, err)
		case tt.wantIn != "" && (err == nil || !strings.Contains(err.Error(), tt.wantIn)):
			t.Errorf("Check(%v) = %v, want denials %s", tt.namespaces, err, tt.wantIn)
		case tt.wantIn != "" && strings.Contains(err.Error(), `"`+granted+`"`):
			t.Errorf("Check(%v) denies in the granted namespace: %v", tt.namespaces, err)
		}
	}
}
