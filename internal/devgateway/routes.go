// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

// InferencePool backendRefs are recognised by this group and kind.
const (
	PoolGroup = "inference.networking.k8s.io"
	PoolKind  = "InferencePool"
)

// table is the compiled routing state: every match of every HTTPRoute rule,
// in Gateway API precedence order, and the pools they point at. Immutable;
// rebuilt and swapped whole when a route or pool changes.
type table struct {
	entries []*entry
	pools   map[types.NamespacedName]*poolTarget
}

// poolTarget is what the gateway needs of an InferencePool.
type poolTarget struct {
	key types.NamespacedName
	// authority is the :authority of ext_proc streams for this pool, in the
	// form kgateway sends: SVC.NS.svc:PORT of the pool's endpointPickerRef.
	authority string
	// service and port name the endpointPickerRef Service.
	service     string
	port        int32
	failOpen    bool
	h2c         bool
	targetPorts []int32
	// invalid says why the pool cannot be routed to (no endpointPickerRef...).
	invalid string
}

// entry is one match of one rule of one route.
type entry struct {
	route     types.NamespacedName
	rule      int
	created   time.Time
	hostnames []string

	pathType  gwv1.PathMatchType
	pathValue string
	pathRE    *regexp.Regexp
	method    string
	headers   []valueMatch
	query     []valueMatch

	backends []weightedPool
	// headerMod is the rule's RequestHeaderModifier, nil when none.
	headerMod *gwv1.HTTPHeaderFilter
	// timeout is the rule's request timeout; zero means none.
	timeout time.Duration
	// invalid, when set, is answered 500 for requests matching the entry:
	// the Gateway API's answer for rules whose backends or filters cannot
	// be honoured.
	invalid string
}

type valueMatch struct {
	name  string
	exact string
	re    *regexp.Regexp
}

type weightedPool struct {
	pool   types.NamespacedName
	weight int32
}

// routeError is an answer the gateway gives itself, without ext_proc.
type routeError struct {
	code int
	msg  string
}

func (e *routeError) Error() string { return e.msg }

// buildTable compiles routes (already filtered to this gateway's) and pools.
func buildTable(routes []gwv1.HTTPRoute, pools []v1.InferencePool) *table {
	t := &table{pools: map[types.NamespacedName]*poolTarget{}}
	for i := range pools {
		p := &pools[i]
		t.pools[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = compilePool(p)
	}
	for i := range routes {
		r := &routes[i]
		key := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
		var hosts []string
		for _, h := range r.Spec.Hostnames {
			hosts = append(hosts, strings.ToLower(string(h)))
		}
		for ri, rule := range r.Spec.Rules {
			base := entry{route: key, rule: ri, created: r.CreationTimestamp.Time, hostnames: hosts}
			base.backends, base.invalid = compileBackends(r.Namespace, rule.BackendRefs)
			for _, f := range rule.Filters {
				if f.Type == gwv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil {
					base.headerMod = f.RequestHeaderModifier
				} else if base.invalid == "" {
					base.invalid = fmt.Sprintf("HTTPRoute %s rule %d: filter type %s is not supported by the development gateway", key, ri, f.Type)
				}
			}
			if rule.Timeouts != nil && rule.Timeouts.Request != nil {
				if d, err := time.ParseDuration(string(*rule.Timeouts.Request)); err == nil {
					base.timeout = d
				}
			}
			matches := rule.Matches
			if len(matches) == 0 {
				matches = []gwv1.HTTPRouteMatch{{}}
			}
			for _, m := range matches {
				e := base
				if err := e.compileMatch(m); err != "" && e.invalid == "" {
					e.invalid = fmt.Sprintf("HTTPRoute %s rule %d: %s", key, ri, err)
				}
				t.entries = append(t.entries, &e)
			}
		}
	}
	slices.SortStableFunc(t.entries, precedence)
	return t
}

func compilePool(p *v1.InferencePool) *poolTarget {
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	pt := &poolTarget{key: key, h2c: p.Spec.AppProtocol == v1.AppProtocolH2C}
	for _, tp := range p.Spec.TargetPorts {
		pt.targetPorts = append(pt.targetPorts, int32(tp.Number))
	}
	ref := p.Spec.EndpointPickerRef
	switch {
	case ref == nil:
		pt.invalid = fmt.Sprintf("InferencePool %s has no spec.endpointPickerRef", key)
	case ref.Kind != "" && ref.Kind != "Service":
		pt.invalid = fmt.Sprintf("InferencePool %s: endpointPickerRef kind %s is not supported (only Service)", key, ref.Kind)
	case ref.Port == nil:
		pt.invalid = fmt.Sprintf("InferencePool %s: endpointPickerRef has no port", key)
	default:
		pt.service, pt.port = string(ref.Name), int32(ref.Port.Number)
		pt.authority = fmt.Sprintf("%s.%s.svc:%d", ref.Name, p.Namespace, ref.Port.Number)
		pt.failOpen = ref.FailureMode == v1.EndpointPickerFailOpen
	}
	return pt
}

func compileBackends(ns string, refs []gwv1.HTTPBackendRef) ([]weightedPool, string) {
	if len(refs) == 0 {
		return nil, "rule has no backendRefs"
	}
	var out []weightedPool
	for _, r := range refs {
		group, kind := "", "Service"
		if r.Group != nil {
			group = string(*r.Group)
		}
		if r.Kind != nil {
			kind = string(*r.Kind)
		}
		if group != PoolGroup || kind != PoolKind {
			return nil, fmt.Sprintf("backendRef %s/%s %s is not an InferencePool (group %s): the development gateway routes only to InferencePools", group, kind, r.Name, PoolGroup)
		}
		target := ns
		if r.Namespace != nil && string(*r.Namespace) != ns {
			// Honouring another namespace needs a ReferenceGrant, which this
			// gateway does not read: refuse rather than bypass the grant.
			return nil, fmt.Sprintf("backendRef to InferencePool %s/%s crosses namespaces; ReferenceGrants are not supported by the development gateway", *r.Namespace, r.Name)
		}
		w := int32(1)
		if r.Weight != nil {
			w = *r.Weight
		}
		out = append(out, weightedPool{pool: types.NamespacedName{Namespace: target, Name: string(r.Name)}, weight: w})
	}
	return out, ""
}

// compileMatch fills the entry's match fields; it returns a message for
// matches it cannot compile.
func (e *entry) compileMatch(m gwv1.HTTPRouteMatch) string {
	e.pathType, e.pathValue = gwv1.PathMatchPathPrefix, "/"
	if m.Path != nil {
		if m.Path.Type != nil {
			e.pathType = *m.Path.Type
		}
		if m.Path.Value != nil {
			e.pathValue = *m.Path.Value
		}
	}
	if e.pathType == gwv1.PathMatchRegularExpression {
		re, err := regexp.Compile("^(?:" + e.pathValue + ")$")
		if err != nil {
			return fmt.Sprintf("path regular expression %q: %v", e.pathValue, err)
		}
		e.pathRE = re
	}
	if m.Method != nil {
		e.method = string(*m.Method)
	}
	for _, h := range m.Headers {
		vm, err := compileValueMatch(string(h.Name), h.Value, h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression)
		if err != "" {
			return err
		}
		e.headers = append(e.headers, vm)
	}
	for _, q := range m.QueryParams {
		vm, err := compileValueMatch(string(q.Name), q.Value, q.Type != nil && *q.Type == gwv1.QueryParamMatchRegularExpression)
		if err != "" {
			return err
		}
		vm.name = string(q.Name) // query parameter names are case-sensitive
		e.query = append(e.query, vm)
	}
	return ""
}

func compileValueMatch(name, value string, isRE bool) (valueMatch, string) {
	vm := valueMatch{name: http.CanonicalHeaderKey(name), exact: value}
	if isRE {
		re, err := regexp.Compile(value)
		if err != nil {
			return vm, fmt.Sprintf("regular expression %q for %s: %v", value, name, err)
		}
		vm.re = re
	}
	return vm, ""
}

func (v *valueMatch) matches(s string, ok bool) bool {
	if !ok {
		return false
	}
	if v.re != nil {
		return v.re.MatchString(s)
	}
	return s == v.exact
}

// precedence orders entries as the Gateway API specifies for HTTPRoute
// matches (hostnames aside, which are compared per request): Exact path,
// then the longest prefix, then method, then most header matches, then most
// query matches; ties go to the oldest route, then by namespace/name, then
// rule order.
func precedence(a, b *entry) int {
	rank := func(e *entry) int {
		switch e.pathType {
		case gwv1.PathMatchExact:
			return 2
		case gwv1.PathMatchPathPrefix:
			return 1
		}
		return 0
	}
	if d := rank(b) - rank(a); d != 0 {
		return d
	}
	if d := len(b.pathValue) - len(a.pathValue); d != 0 && a.pathType == gwv1.PathMatchPathPrefix {
		return d
	}
	if d := boolInt(b.method != "") - boolInt(a.method != ""); d != 0 {
		return d
	}
	if d := len(b.headers) - len(a.headers); d != 0 {
		return d
	}
	if d := len(b.query) - len(a.query); d != 0 {
		return d
	}
	if c := a.created.Compare(b.created); c != 0 {
		return c
	}
	if c := strings.Compare(a.route.String(), b.route.String()); c != 0 {
		return c
	}
	return a.rule - b.rule
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hostScore ranks how well a route's hostnames match host: 3 exact, 2
// wildcard (longer suffix is not distinguished), 1 no hostnames (any host),
// 0 no match.
func hostScore(hostnames []string, host string) int {
	if len(hostnames) == 0 {
		return 1
	}
	best := 0
	for _, h := range hostnames {
		switch {
		case h == host:
			return 3
		case strings.HasPrefix(h, "*.") && strings.HasSuffix(host, h[1:]) && len(host) > len(h)-1:
			best = 2
		}
	}
	return best
}

func (e *entry) matches(r *http.Request) bool {
	p := r.URL.Path
	switch e.pathType {
	case gwv1.PathMatchExact:
		if p != e.pathValue {
			return false
		}
	case gwv1.PathMatchPathPrefix:
		prefix := strings.TrimSuffix(e.pathValue, "/")
		if prefix != "" && p != prefix && !strings.HasPrefix(p, prefix+"/") {
			return false
		}
	case gwv1.PathMatchRegularExpression:
		if e.pathRE == nil || !e.pathRE.MatchString(p) {
			return false
		}
	default:
		return false
	}
	if e.method != "" && r.Method != e.method {
		return false
	}
	for i := range e.headers {
		vals, ok := r.Header[e.headers[i].name]
		v := ""
		if ok && len(vals) > 0 {
			v = vals[0]
		}
		if !e.headers[i].matches(v, ok) {
			return false
		}
	}
	q := r.URL.Query()
	for i := range e.query {
		vals, ok := q[e.query[i].name]
		v := ""
		if ok && len(vals) > 0 {
			v = vals[0]
		}
		if !e.query[i].matches(v, ok) {
			return false
		}
	}
	return true
}

// route finds the request's entry and picks one of its pools by weight.
func (t *table) route(r *http.Request) (*entry, *poolTarget, *routeError) {
	host := strings.ToLower(r.Host)
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	var best *entry
	bestScore := 0
	for _, e := range t.entries {
		s := hostScore(e.hostnames, host)
		if s > bestScore && e.matches(r) {
			best, bestScore = e, s
		}
	}
	if best == nil {
		return nil, nil, &routeError{code: http.StatusNotFound, msg: fmt.Sprintf("no HTTPRoute matches %s %s (host %q)", r.Method, r.URL.Path, host)}
	}
	if best.invalid != "" {
		return best, nil, &routeError{code: http.StatusInternalServerError, msg: best.invalid}
	}
	var total int64
	for _, b := range best.backends {
		total += int64(max(0, b.weight))
	}
	if total == 0 {
		return best, nil, &routeError{code: http.StatusInternalServerError, msg: fmt.Sprintf("HTTPRoute %s rule %d: every backendRef has weight 0", best.route, best.rule)}
	}
	n := rand.Int64N(total)
	var chosen types.NamespacedName
	for _, b := range best.backends {
		if n < int64(max(0, b.weight)) {
			chosen = b.pool
			break
		}
		n -= int64(max(0, b.weight))
	}
	pool, ok := t.pools[chosen]
	if !ok {
		return best, nil, &routeError{code: http.StatusInternalServerError, msg: fmt.Sprintf("HTTPRoute %s rule %d: InferencePool %s not found", best.route, best.rule, chosen)}
	}
	if pool.invalid != "" {
		return best, nil, &routeError{code: http.StatusInternalServerError, msg: pool.invalid}
	}
	return best, pool, nil
}
