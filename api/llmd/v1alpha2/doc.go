// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package v1alpha2 holds the Go types of InferenceObjective and
// InferenceModelRewrite in API group llm-d.ai version v1alpha2, where the
// llm-d router serves them now, wire-compatible with its published CRDs. The
// fields mean what they mean in the inference.networking.x-k8s.io group
// (package api/v1alpha2); poolpicker reads both.
//
// +kubebuilder:object:generate=true
// +groupName=llm-d.ai
package v1alpha2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of the types in this package.
	GroupVersion = schema.GroupVersion{Group: "llm-d.ai", Version: "v1alpha2"}

	// SchemeBuilder registers the types of this package with a runtime.Scheme
	// (apimachinery's, so that importing the API needs no controller-runtime).
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &InferenceObjective{}, &InferenceObjectiveList{},
		&InferenceModelRewrite{}, &InferenceModelRewriteList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
