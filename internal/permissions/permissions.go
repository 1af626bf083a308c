// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package permissions lists the Kubernetes API permissions poolpicker needs,
// each with its reason, and checks them at start-up.
package permissions

import (
	"context"
	"fmt"
	"slices"
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
	// Scope is where the rule is needed. Zero: PoolNamespaces.
	Scope Scope
	// Features are the flags (without their dashes) of the features that
	// need the rule; empty: always needed. Needed drops a rule when every
	// one of its features is off, so that its permissions are asked for
	// only when used.
	Features []string
	// IfServed, when set, is the API group/version of the resource of a
	// rule needed only when the API server serves it (a CRD that may not be
	// installed): the start-up check leaves the rule out otherwise. The
	// manifests grant it always.
	IfServed string
}

// Scope is where a Rule is needed, which is also how the manifests grant it.
type Scope int

const (
	// PoolNamespaces are the namespaces whose pools are served: every
	// namespace unless --watch-namespaces or --pool-name narrow them. The
	// manifests grant these rules with the ClusterRole.
	PoolNamespaces Scope = iota
	// OwnNamespace is the deployment's own namespace (--picker-namespace):
	// its Lease and its pods. The manifests grant these rules with a Role
	// there.
	OwnNamespace
)

// Flags of the features that need rules of their own.
const (
	FeatureLeaderElection = "ha-enable-leader-election"
	FeatureProvisioning   = "provision-picker-services"
	FeaturePeerSync       = "peer-sync"
)

// Needed returns the rules of rules needed with the features for which on
// reports true, in order: those needed always, and those one of whose
// features is on.
func Needed(rules []Rule, on func(feature string) bool) []Rule {
	var out []Rule
	for _, r := range rules {
		if len(r.Features) == 0 || slices.ContainsFunc(r.Features, on) {
			out = append(out, r)
		}
	}
	return out
}

// InScope returns the rules of rules with the given scope, in order.
func InScope(rules []Rule, scope Scope) []Rule {
	var out []Rule
	for _, r := range rules {
		if r.Scope == scope {
			out = append(out, r)
		}
	}
	return out
}

// Rules is every permission poolpicker uses, the source of the ClusterRole
// (PoolNamespaces) and the Role (OwnNamespace) in config/deploy and
// charts/poolpicker (test/install checks that they agree, test/rbac that
// poolpicker runs with nothing more). Add a rule here, in both manifests
// and in site-src/install.md when new code calls the API.
var Rules = []Rule{
	{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verbs: []string{"get", "list", "watch"},
		Why: "find the pools to serve (the controllers' cache lists and watches them; an objective of an unserved pool reads its pool's metadata)"},
	{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verbs: []string{"patch"},
		Why: "claim a served pool (annotation poolpicker.io/served-by) so that no other deployment serves it too, and release the claim; mark a pool whose requests wait for its first ready endpoint (annotation poolpicker.io/requests-waiting, written by the leader from each replica's own `requests-waiting.poolpicker.io/<replica>` signal, flow control)"},
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
	{Group: "gateway.networking.k8s.io", Resource: "httproutes", Verbs: []string{"list", "watch"}, IfServed: "gateway.networking.k8s.io/v1",
		Why: "warn on a pool that an HTTPRoute sends traffic to but that no picker serves (Event PoolNotServed naming the opt-in label); neither read nor asked for when the API server serves no HTTPRoutes"},
	{Group: "", Resource: "services", Verbs: []string{"get", "list", "watch", "create", "update", "delete"}, Features: []string{FeatureProvisioning},
		Why: "create each served pool's picker Service where it is missing, keep it right, and remove it when the pool is no longer served"},
	{Group: "discovery.k8s.io", Resource: "endpointslices", Verbs: []string{"get", "list", "watch", "create", "update", "delete"}, Features: []string{FeatureProvisioning},
		Why: "list this deployment's ready replicas in an EndpointSlice of each provisioned picker Service, and remove it with the Service"},
	{Group: "", Resource: "pods", Verbs: []string{"list", "watch"}, Scope: OwnNamespace, Features: []string{FeatureProvisioning, FeaturePeerSync},
		Why: "follow this deployment's own replicas (--picker-pod-selector): the endpoints of the provisioned picker Services, and the peers of peer sync (not with --peer-sync-peers)"},
	{Group: "coordination.k8s.io", Resource: "leases", Verbs: []string{"get", "create", "update"}, Scope: OwnNamespace, Features: []string{FeatureLeaderElection},
		Why: "elect the leader, the one replica that writes (the Lease named --picker-name)"},
	{Group: "", Resource: "events", Verbs: []string{"create", "patch"}, Scope: OwnNamespace, Features: []string{FeatureLeaderElection},
		Why: "record leader changes as Events on the Lease (client-go's leader election)"},
}

// MetricsAuthRules are what --metrics-endpoint-auth (on by default, as
// upstream) needs to check each scrape's bearer token. They are cluster-scoped
// (a ClusterRole bound by a ClusterRoleBinding grants them) and asked for
// apart from Rules, only when the flag is on.
var MetricsAuthRules = []Rule{
	{Group: "authentication.k8s.io", Resource: "tokenreviews", Verbs: []string{"create"},
		Why: "authenticate the bearer token of a request to the metrics port (--metrics-endpoint-auth)"},
	{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verbs: []string{"create"},
		Why: "ask whether that token's user may get /metrics, or the pprof path (--metrics-endpoint-auth)"},
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
	fmt.Fprintf(&b, "missing RBAC permissions: the API server denies %s %d of the permissions poolpicker needs (grant them with the ClusterRole and Role of config/deploy or charts/poolpicker):", who, len(e.Denied))
	for _, d := range e.Denied {
		b.WriteString("\n  - ")
		b.WriteString(d.String())
	}
	return b.String()
}

// Namespaces says where Check asks for each Scope.
type Namespaces struct {
	// Pools are the namespaces of PoolNamespaces rules; empty means all
	// namespaces.
	Pools []string
	// Own is the namespace of OwnNamespace rules.
	Own string
}

// Check asks the API server at cfg, with SelfSubjectAccessReviews (which
// every authenticated user may create), whether the caller holds every verb
// of every rule in each namespace of its scope ("" for all namespaces). It
// returns an *Error listing each denied verb, or nil when all are allowed,
// so that a missing permission stops start-up with its name instead of a
// watch retrying forever.
func Check(ctx context.Context, cfg *rest.Config, rules []Rule, where Namespaces) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("permissions: %w", err)
	}
	pools := append([]string(nil), where.Pools...)
	if len(pools) == 0 {
		pools = []string{""}
	}
	sort.Strings(pools)
	type ask struct {
		ns   string
		rule Rule
	}
	var asks []ask
	for _, ns := range pools {
		for _, r := range InScope(rules, PoolNamespaces) {
			asks = append(asks, ask{ns, r})
		}
	}
	for _, r := range InScope(rules, OwnNamespace) {
		asks = append(asks, ask{where.Own, r})
	}
	var denied []Denied
	for _, a := range asks {
		resource, sub, _ := strings.Cut(a.rule.Resource, "/")
		for _, verb := range a.rule.Verbs {
			review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: a.ns, Verb: verb, Group: a.rule.Group, Resource: resource, Subresource: sub},
			}}
			got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("permissions: asking the API server whether %s %s is allowed: %w", verb, a.rule.Resource, err)
			}
			if !got.Status.Allowed {
				denied = append(denied, Denied{Rule: a.rule, Verb: verb, Namespace: a.ns})
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
