// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// The picker reads Gateway API HTTPRoutes for one thing: the InferencePools
// their rules send traffic to, so that a pool a route sends traffic to but
// that no picker serves gets a Warning naming the opt-in label (as a pool
// that objectives refer to does). It decodes a route into httpRoute, the
// few fields it needs, rather than importing the Gateway API's types: the
// rest of a route is dropped as it is decoded.

// httpRouteGroupVersion is the Gateway API version whose HTTPRoutes are
// read (the standard channel's since Gateway API v1.0).
var httpRouteGroupVersion = schema.GroupVersion{Group: "gateway.networking.k8s.io", Version: "v1"}

// routePoolIndex indexes HTTPRoutes by the key (namespace/name) of each
// InferencePool a rule of theirs sends traffic to.
const routePoolIndex = "spec.rules.backendRefs.inferencePool"

// httpRoute is the part of a gateway.networking.k8s.io/v1 HTTPRoute the
// picker reads: its rules' backendRefs.
type httpRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              httpRouteSpec `json:"spec"`
}

type httpRouteSpec struct {
	Rules []httpRouteRule `json:"rules,omitempty"`
}

type httpRouteRule struct {
	BackendRefs []httpBackendRef `json:"backendRefs,omitempty"`
}

// httpBackendRef is a backendRef of a rule. The Gateway API defaults an
// empty Group to the core group and an empty Kind to Service; an empty
// Namespace is the route's.
type httpBackendRef struct {
	Group     string `json:"group,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

type httpRouteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []httpRoute `json:"items"`
}

func (r *httpRoute) DeepCopyObject() runtime.Object {
	out := &httpRoute{TypeMeta: r.TypeMeta}
	meta := &r.ObjectMeta
	meta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Rules = make([]httpRouteRule, len(r.Spec.Rules))
	for i, rule := range r.Spec.Rules {
		out.Spec.Rules[i].BackendRefs = append([]httpBackendRef(nil), rule.BackendRefs...)
	}
	return out
}

func (l *httpRouteList) DeepCopyObject() runtime.Object {
	out := &httpRouteList{TypeMeta: l.TypeMeta}
	meta := &l.ListMeta
	meta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]httpRoute, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*httpRoute)
	}
	return out
}

// addHTTPRouteToScheme registers httpRoute as the HTTPRoute kind of
// httpRouteGroupVersion.
func addHTTPRouteToScheme(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(httpRouteGroupVersion.WithKind("HTTPRoute"), &httpRoute{})
	s.AddKnownTypeWithName(httpRouteGroupVersion.WithKind("HTTPRouteList"), &httpRouteList{})
	metav1.AddToGroupVersion(s, httpRouteGroupVersion)
	return nil
}

// servesHTTPRoutes reports whether the API server serves HTTPRoutes of
// httpRouteGroupVersion (the Gateway API's CRDs are installed). Decided at
// start: CRDs installed later are read after a restart.
func servesHTTPRoutes(mapper meta.RESTMapper) (bool, error) {
	_, err := mapper.RESTMapping(schema.GroupKind{Group: httpRouteGroupVersion.Group, Kind: "HTTPRoute"}, httpRouteGroupVersion.Version)
	switch {
	case meta.IsNoMatchError(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("controllers: looking up HTTPRoute %s: %w", httpRouteGroupVersion, err)
	}
	return true, nil
}

// routedPools returns the keys of the InferencePools (of the
// inference.networking.k8s.io group) the route's rules send traffic to,
// each once.
func routedPools(r *httpRoute) []datastore.PoolKey {
	var keys []datastore.PoolKey
	seen := map[datastore.PoolKey]bool{}
	for _, rule := range r.Spec.Rules {
		for _, ref := range rule.BackendRefs {
			if !isPoolBackend(ref) {
				continue
			}
			key := datastore.PoolKey{Namespace: ref.Namespace, Name: ref.Name}
			if key.Namespace == "" {
				key.Namespace = r.Namespace
			}
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
	}
	return keys
}

func isPoolBackend(ref httpBackendRef) bool {
	return ref.Group == v1.GroupVersion.Group && ref.Kind == "InferencePool" && ref.Name != ""
}

// routePoolIndexValues are the routePoolIndex values of a route.
func routePoolIndexValues(o client.Object) []string {
	keys := routedPools(o.(*httpRoute))
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.String()
	}
	return out
}

// leanRoute is the cache's transform of HTTPRoutes: it keeps what the
// index, the Event note and level-based reconciling need (name, namespace,
// generation, the pool backendRefs) and drops the rest, so that a cluster
// with many routes to Services costs the cache little.
func leanRoute(obj any) (any, error) {
	r, ok := obj.(*httpRoute)
	if !ok {
		return obj, nil
	}
	lean := &httpRoute{TypeMeta: r.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, UID: r.UID,
		ResourceVersion: r.ResourceVersion, Generation: r.Generation, CreationTimestamp: r.CreationTimestamp, DeletionTimestamp: r.DeletionTimestamp}}
	for _, rule := range r.Spec.Rules {
		var refs []httpBackendRef
		for _, ref := range rule.BackendRefs {
			if isPoolBackend(ref) {
				refs = append(refs, ref)
			}
		}
		if len(refs) > 0 {
			lean.Spec.Rules = append(lean.Spec.Rules, httpRouteRule{BackendRefs: refs})
		}
	}
	return lean, nil
}
