package permissions_test

import (
	"context"
	"errors"
	"os"
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

// bind grants the ServiceAccount ns/name a ClusterRole of rules, cluster-wide
// or, when roleNS is set, only in that namespace.
func bind(t *testing.T, ctx context.Context, ns, name, roleNS string, rules []rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Rules: rules}
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

// TestCheckNamesEachMissingVerb grants a ServiceAccount every rule but one
// verb, for each verb of each rule in turn: Check must name exactly that
// verb, its resource, group and reason, and the account.
func TestCheckNamesEachMissingVerb(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := env.Namespace(t, "perm")

	t.Run("all granted", func(t *testing.T) {
		bind(t, ctx, ns, "full", "", deploytest.PolicyRulesWithout(permissions.Rules, -1, ""))
		cfg, err := env.ServiceAccountConfig(ctx, ns, "full")
		if err != nil {
			t.Fatal(err)
		}
		if err := permissions.Check(ctx, cfg, permissions.Rules, nil); err != nil {
			t.Fatalf("Check with every rule granted: %v", err)
		}
	})

	n := 0
	for i, r := range permissions.Rules {
		for _, verb := range r.Verbs {
			n++
			name := "minus-" + strings.ReplaceAll(strings.ReplaceAll(r.Resource, "/", "-"), ".", "-") + "-" + verb
			t.Run(name, func(t *testing.T) {
				bind(t, ctx, ns, name, "", deploytest.PolicyRulesWithout(permissions.Rules, i, verb))
				cfg, err := env.ServiceAccountConfig(ctx, ns, name)
				if err != nil {
					t.Fatal(err)
				}
				err = permissions.Check(ctx, cfg, permissions.Rules, nil)
				var perr *permissions.Error
				if !errors.As(err, &perr) {
					t.Fatalf("Check = %v, want a permissions *permissions.Error", err)
				}
				if len(perr.Denied) != 1 || perr.Denied[0].Verb != verb || perr.Denied[0].Rule.Resource != r.Resource {
					t.Fatalf("denied %v, want only %s %s", perr.Denied, verb, r.Resource)
				}
				msg := err.Error()
				for _, want := range []string{verb + " " + r.Resource, r.Why, "system:serviceaccount:" + ns + ":" + name, "in all namespaces"} {
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

// TestCheckPerNamespace grants the rules only in one namespace: a check of
// that namespace passes, a check of another (or of all namespaces) names the
// namespace it was denied in.
func TestCheckPerNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	granted, other := env.Namespace(t, "perm-in"), env.Namespace(t, "perm-out")
	bind(t, ctx, granted, "scoped", granted, deploytest.PolicyRulesWithout(permissions.Rules, -1, ""))
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
		err := permissions.Check(ctx, cfg, permissions.Rules, tt.namespaces)
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
