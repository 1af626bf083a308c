// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/poolpicker/poolpicker/datastore"
)

// authorityRef is what a stream's :authority says about the pool.
type authorityRef struct {
	// Namespace, Service and Port name the pool's endpointPickerRef (Port 0:
	// the form carried none).
	Namespace, Service string
	Port               int32
	// Pool is set by forms that name the pool itself (Kubvernor).
	Pool datastore.PoolKey
}

func (a authorityRef) picker() bool { return a.Service != "" }

const kubvernorMarker = "_route-extsvc-"

// parseAuthority understands every :authority form of site-src/protocols.md ("Which pool a stream is for"):
//
//	outbound|PORT||SVC.NS.svc.cluster.local  (Istio)
//	SVC.NS.svc:PORT                           (kgateway, Envoy AI Gateway)
//	SVC.NS.svc.cluster.local:PORT             (agentgateway; any cluster domain)
//	SVC.NS:PORT                               (NGINX Gateway Fabric)
//	ROUTE_route-extsvc-NS.POOL                (Kubvernor, names the pool)
//
// A bare IP, a name without namespace or anything else yields ok=false.
func parseAuthority(a string) (authorityRef, bool) {
	ref, ok := parseAuthorityForm(strings.TrimSpace(a))
	if !ok {
		return authorityRef{}, false
	}
	return ref, true
}

func parseAuthorityForm(a string) (ref authorityRef, ok bool) {
	if a == "" {
		return ref, false
	}
	if i := strings.LastIndex(a, kubvernorMarker); i >= 0 {
		rest := a[i+len(kubvernorMarker):]
		// Namespaces are DNS labels (no dots); pool names may hold dots.
		if j := strings.IndexByte(rest, '.'); j > 0 && j < len(rest)-1 {
			return authorityRef{Pool: datastore.PoolKey{Namespace: rest[:j], Name: rest[j+1:]}}, true
		}
		return ref, false
	}
	host, port := a, ""
	if strings.HasPrefix(a, "outbound|") || strings.HasPrefix(a, "inbound|") {
		parts := strings.Split(a, "|")
		if len(parts) != 4 {
			return ref, false
		}
		host, port = parts[3], parts[1]
	} else if h, p, err := net.SplitHostPort(a); err == nil {
		host, port = h, p
	}
	// An IP address is no service name: the label test below refuses it
	// (no "svc" label, never exactly two labels, or no dot at all).
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return ref, false
		}
		ref.Port = int32(n)
	}
	// SVC.NS, or SVC.NS.svc[.anything].
	svc, rest, ok := strings.Cut(strings.TrimSuffix(host, "."), ".")
	if !ok {
		return ref, false
	}
	ns, rest, more := strings.Cut(rest, ".")
	if more && rest != "svc" && !strings.HasPrefix(rest, "svc.") {
		return ref, false
	}
	if svc == "" || ns == "" {
		return ref, false
	}
	ref.Service, ref.Namespace = svc, ns
	return ref, true
}

// resolveInput is everything a stream carries that may name its pool.
type resolveInput struct {
	// tags are explicit x-gateway-inference-pool values with where they came from.
	tags []sourcedValue
	// authority is the gRPC stream's :authority.
	authority string
	// eppHost and eppPort are NGINX Gateway Fabric's x-epp-host / x-epp-port.
	eppHost, eppPort string
	// subset is the gateway's subset hint, nil when absent.
	subset []string
	// header is the request header x-gateway-inference-pool, set only when
	// the operator trusts it.
	header string
}

type sourcedValue struct{ source, value string }

// resolvePool finds the stream's pool by index lookups in the order of
// site-src/protocols.md ("Which pool a stream is for"); it never scans the registry. The returned string says
// which source decided, for logs.
func resolvePool(reg *datastore.Registry, in *resolveInput) (*datastore.Pool, string, *httpError) {
	// 1. Explicit tag.
	if len(in.tags) > 0 {
		first := in.tags[0]
		for _, t := range in.tags[1:] {
			if strings.TrimSpace(t.value) != strings.TrimSpace(first.value) {
				return nil, "", errUnresolved("ambiguous pool tag %s: %s says %q, %s says %q", hdrPoolTag, first.source, first.value, t.source, t.value)
			}
		}
		key, ok := parsePoolKey(first.value)
		if !ok {
			return nil, "", errUnresolved("malformed pool tag %s=%q from %s, want namespace/name", hdrPoolTag, first.value, first.source)
		}
		if p, ok := reg.Get(key); ok {
			return p, first.source, nil
		}
		return nil, "", &httpError{code: http.StatusNotFound, reason: "UnknownPool",
			msg: fmt.Sprintf("InferencePool %s named by %s is not served by this endpoint picker", key, first.source)}
	}

	// 2. :authority, then NGINX Gateway Fabric's headers.
	var candidates []*datastore.Pool
	var seen []string
	// what names where ref came from, as in "x-epp-host \"a:1\"", for the
	// error only: it is made when needed.
	tryPicker := func(ref authorityRef, from, value string) *datastore.Pool {
		what := func() string { return fmt.Sprintf("%s %q", from, value) }
		if !ref.picker() {
			if p, ok := reg.Get(ref.Pool); ok {
				return p
			}
			seen = append(seen, fmt.Sprintf("%s names pool %s, which is not served", what(), ref.Pool))
			return nil
		}
		ps := reg.ByPicker(ref.Namespace, ref.Service, ref.Port)
		if len(ps) == 0 && ref.Port != 0 {
			// The port may be the Service's target port rather than its port;
			// the Service name alone still identifies the picker if unique.
			ps = reg.ByPicker(ref.Namespace, ref.Service, 0)
		}
		switch len(ps) {
		case 0:
			seen = append(seen, fmt.Sprintf("%s (service %s/%s port %d) matches no served pool's endpointPickerRef", what(), ref.Namespace, ref.Service, ref.Port))
		case 1:
			return ps[0]
		default:
			candidates = ps
			seen = append(seen, fmt.Sprintf("%s matches %d pools (%s)", what(), len(ps), poolNames(ps)))
		}
		return nil
	}
	if ref, ok := parseAuthority(in.authority); ok {
		if p := tryPicker(ref, ":authority", in.authority); p != nil {
			return p, "authority", nil
		}
	} else if in.authority != "" {
		seen = append(seen, fmt.Sprintf(":authority %q names no service", in.authority))
	}
	if in.eppHost != "" && candidates == nil {
		a := in.eppHost
		if in.eppPort != "" {
			a = net.JoinHostPort(in.eppHost, in.eppPort)
		}
		if ref, ok := parseAuthority(a); ok {
			if p := tryPicker(ref, "x-epp-host", a); p != nil {
				return p, "x-epp-host", nil
			}
		} else {
			seen = append(seen, fmt.Sprintf("x-epp-host %q names no service", a))
		}
	}

	// 3. Subset hint: the pool owning the hinted endpoints.
	if len(in.subset) > 0 {
		var owners []*datastore.Pool
		for _, addr := range in.subset {
			for _, p := range reg.ByEndpoint(addr) {
				if !containsPool(owners, p) && (candidates == nil || containsPool(candidates, p)) {
					owners = append(owners, p)
				}
			}
		}
		if len(owners) == 1 {
			return owners[0], "subset-hint", nil
		}
		seen = append(seen, fmt.Sprintf("subset hint %s is owned by %d pools", listSummary(in.subset), len(owners)))
	}

	// 4. A plain request header, only when trusted.
	if in.header != "" {
		key, ok := parsePoolKey(in.header)
		if !ok {
			return nil, "", errUnresolved("malformed request header %s=%q, want namespace/name", hdrPoolTag, in.header)
		}
		if p, ok := reg.Get(key); ok {
			return p, "header", nil
		}
		return nil, "", &httpError{code: http.StatusNotFound, reason: "UnknownPool",
			msg: fmt.Sprintf("InferencePool %s named by request header %s is not served by this endpoint picker", key, hdrPoolTag)}
	}

	// 5. A single served pool needs no tag.
	if candidates == nil && reg.Len() == 1 {
		return reg.Pools()[0], "single-pool", nil
	}
	if len(seen) == 0 {
		seen = append(seen, "no pool tag, :authority, x-epp-host or subset hint")
	}
	return nil, "", errUnresolved("cannot tell which InferencePool this stream is for among %d served: %s; %s",
		reg.Len(), strings.Join(seen, "; "), optInHint)
}

// optInHint is the usual cause of an unresolved pool, said where a user
// sees it: the default --pool-selector serves only the pools that opt in.
const optInHint = "an InferencePool is served only when it matches --pool-selector, by default when it carries the opt-in label " +
	"poolpicker.io/picker=<picker name> (kubectl label inferencepool NAME poolpicker.io/picker=poolpicker)"

func parsePoolKey(s string) (datastore.PoolKey, bool) {
	s = strings.TrimSpace(s)
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return datastore.PoolKey{}, false
	}
	return datastore.PoolKey{Namespace: ns, Name: name}, true
}

func containsPool(ps []*datastore.Pool, p *datastore.Pool) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func poolNames(ps []*datastore.Pool) string {
	names := make([]string, 0, len(ps))
	for i, p := range ps {
		if i == 5 {
			names = append(names, "...")
			break
		}
		names = append(names, p.Key.String())
	}
	return strings.Join(names, ", ")
}

func errUnresolved(format string, args ...any) *httpError {
	return &httpError{code: http.StatusServiceUnavailable, reason: "PoolNotResolved", msg: fmt.Sprintf(format, args...)}
}

// errNotSynced refuses a request for a pool whose pods are not listed yet,
// naming why when listing them failed.
func errNotSynced(p *datastore.Pool) *httpError {
	if reason := p.SyncError(); reason != "" {
		return &httpError{code: http.StatusServiceUnavailable, reason: "PoolNotSynced",
			msg: fmt.Sprintf("InferencePool %s is unavailable: its pods cannot be listed: %s", p.Key, reason)}
	}
	return &httpError{code: http.StatusServiceUnavailable, reason: "PoolNotSynced",
		msg: fmt.Sprintf("InferencePool %s is unavailable: its pods are not listed yet", p.Key)}
}

// listSummaryEntries is how many entries of a list an error message quotes:
// a hint may hold thousands, and the message goes into a response body and
// a log line.
const listSummaryEntries = 4

// listSummary quotes the first entries of list and counts the rest.
func listSummary(list []string) string {
	if len(list) <= listSummaryEntries {
		return fmt.Sprintf("%v", list)
	}
	return fmt.Sprintf("%v and %d more", list[:listSummaryEntries], len(list)-listSummaryEntries)
}
