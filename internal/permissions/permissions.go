// Package permissions lists the Kubernetes API permissions poolpicker needs,
// each with its reason, and checks them at start-up.
package permissions

import (
	"context"
	"fmt"
	"sort"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Rule is one RBAC rule poolpicker needs: the verbs on one resource (or
// "resource/subresource") of one API group.
type Rule struct {
	Group    string
	Resource string
	Verbs    []string
	// Why is the reason, as the install page's RBAC table states it.
	Why string
}

// Rules is every permission poolpicker uses, the source of the ClusterRole in
// config/deploy and charts/poolpicker (test/install checks that they agree
// and that poolpicker runs with nothing more). Add a rule here, in both
// manifests and in site-src/install.md when new code calls the API.
var Rules = []Rule{
	{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verbs: []string{"get", "list", "watch"},
		Why: "find the pools to serve (the controllers' cache lists and watches them; an objective of an unserved pool reads its pool's metadata)"},
	{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verbs: []string{"patch"},
		Why: "claim a served pool (annotation poolpicker.io/served-by) so that no other deployment serves it too, and release the claim"},
	{Group: "events.k8s.io", Resource: "events", Verbs: []string{"create", "patch"},
		Why: "report on a pool what stops it from serving (pods not listable, a claim or picker Service conflict)"},
	{Group: "", Resource: "pods", Verbs: []string{"list", "watch"},
		Why: "follow each served pool's model-server pods (one list+watch per pool, scoped by its selector)"},
	{Group: "inference.networking.x-k8s.io", Resource: "inferenceobjectives", Verbs: []string{"list", "watch"},
		Why: "read each pool's per-model priorities"},
	{Group: "inference.networking.x-k8s.io", Resource: "inferencemodelrewrites", Verbs: []string{"list", "watch"},
		Why: "read each pool's model-name rewrites"},
	{Group: "inference.networking.x-k8s.io", Resource: "inferenceobjectives/status", Verbs: []string{"patch"},
		Why: "set an objective's Accepted condition"},
	{Group: "inference.networking.x-k8s.io", Resource: "inferencemodelrewrites/status", Verbs: []string{"patch"},
		Why: "set a rewrite's Accepted condition"},
	{Group: "llm-d.ai", Resource: "inferenceobjectives", Verbs: []string{"list", "watch"},
		Why: "read each pool's per-model priorities (llm-d router's group)"},
	{Group: "llm-d.ai", Resource: "inferencemodelrewrites", Verbs: []string{"list", "watch"},
		Why: "read each pool's model-name rewrites (llm-d router's group)"},
	{Group: "llm-d.ai", Resource: "inferenceobjectives/status", Verbs: []string{"patch"},
		Why: "set an objective's Accepted condition (llm-d router's group)"},
	{Group: "llm-d.ai", Resource: "inferencemodelrewrites/status", Verbs: []string{"patch"},
		Why: "set a rewrite's Accepted condition (llm-d router's group)"},
}

// Denied is one verb of a Rule the API server refused.
type Denied struct {
	Rule Rule
	Verb string
	// Namespace is where it was asked; empty means all namespaces.
	Namespace string
}

func (d Denied) String() string {
	where := "in all namespaces"
	if d.Namespace != "" {
		where = fmt.Sprintf("in namespace %q", d.Namespace)
	}
	group := d.Rule.Group
	if group == "" {
		group = `"" (core)`
	}
	return fmt.Sprintf("%s %s (API group %s) %s, needed to %s", d.Verb, d.Rule.Resource, group, where, d.Rule.Why)
}

// Error reports the denied permissions of a Check.
type Error struct {
	// User is the authenticated user the API server saw, when it said.
	User   string
	Denied []Denied
}

func (e *Error) Error() string {
	var b strings.Builder
	who := "this identity"
	if e.User != "" {
		who = fmt.Sprintf("%q", e.User)
	}
	fmt.Fprintf(&b, "missing RBAC permissions: the API server denies %s %d of the permissions poolpicker needs (grant them with the ClusterRole of config/deploy or charts/poolpicker):", who, len(e.Denied))
	for _, d := range e.Denied {
		b.WriteString("\n  - ")
		b.WriteString(d.String())
	}
	return b.String()
}

// Check asks the API server at cfg, with SelfSubjectAccessReviews (which
// every authenticated user may create), whether the caller holds every verb
// of every rule in each namespace ("" for all namespaces). It returns an
// *Error listing each denied verb, or nil when all are allowed, so that a
// missing permission stops start-up with its name instead of a watch
// retrying forever.
func Check(ctx context.Context, cfg *rest.Config, rules []Rule, namespaces []string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("permissions: %w", err)
	}
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	namespaces = append([]string(nil), namespaces...)
	sort.Strings(namespaces)
	var denied []Denied
	for _, ns := range namespaces {
		for _, r := range rules {
			resource, sub, _ := strings.Cut(r.Resource, "/")
			for _, verb := range r.Verbs {
				review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
					ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: r.Group, Resource: resource, Subresource: sub},
				}}
				got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
				if err != nil {
					return fmt.Errorf("permissions: asking the API server whether %s %s is allowed: %w", verb, r.Resource, err)
				}
				if !got.Status.Allowed {
					denied = append(denied, Denied{Rule: r, Verb: verb, Namespace: ns})
				}
			}
		}
	}
	if len(denied) == 0 {
		return nil
	}
	e := &Error{Denied: denied}
	// Naming the user helps find the binding to fix; an API server that
	// does not answer this leaves it unnamed.
	if who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{}); err == nil {
		e.User = who.Status.UserInfo.Username
	}
	return e
}
