// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package v1 holds the Go types of InferencePool, API group
// inference.networking.k8s.io version v1, written for poolpicker and kept
// wire-compatible with the published Gateway API Inference Extension CRD:
// same JSON field names, defaults, limits and validation rules.
//
// +kubebuilder:object:generate=true
// +groupName=inference.networking.k8s.io
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of the types in this package.
	GroupVersion = schema.GroupVersion{Group: "inference.networking.k8s.io", Version: "v1"}

	// SchemeBuilder registers the types of this package with a runtime.Scheme
	// (apimachinery's, so that importing the API needs no controller-runtime).
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &InferencePool{}, &InferencePoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
