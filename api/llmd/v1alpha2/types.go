// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1alpha2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	xv1alpha2 "github.com/poolpicker/poolpicker/api/v1alpha2"
)

// InferenceObjective gives requests that name it (header
// x-llm-d-inference-objective, or its older name
// x-gateway-inference-objective) a priority within one pool.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Inference Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Priority",type=string,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InferenceObjective struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceObjectiveSpec   `json:"spec,omitempty"`
	Status InferenceObjectiveStatus `json:"status,omitempty"`
}

// InferenceObjectiveList is a list of InferenceObjectives.
//
// +kubebuilder:object:root=true
type InferenceObjectiveList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceObjective `json:"items"`
}

// InferenceObjectiveSpec is the desired state of an InferenceObjective.
type InferenceObjectiveSpec struct {
	// Priority orders requests under load: higher is served first, and a
	// negative priority marks requests as sheddable when the pool is saturated.
	// Unset means 0.
	//
	// +optional
	Priority *int `json:"priority,omitempty"`

	// PoolRef is the pool this objective applies to.
	//
	// +required
	PoolRef PoolObjectReference `json:"poolRef"`
}

// InferenceObjectiveStatus is the observed state of an InferenceObjective.
type InferenceObjectiveStatus struct {
	// Conditions of the objective; known type: Accepted.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:default={{type: "Ready", status: "Unknown", reason: "Pending", message: "Waiting for controller", lastTransitionTime: "1970-01-01T00:00:00Z"}}
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// InferenceModelRewrite maps the model a request names to one or more target
// models, chosen by weight (canary and A/B splits), within one pool.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Inference Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InferenceModelRewrite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceModelRewriteSpec   `json:"spec,omitempty"`
	Status InferenceModelRewriteStatus `json:"status,omitempty"`
}

// InferenceModelRewriteList is a list of InferenceModelRewrites.
//
// +kubebuilder:object:root=true
type InferenceModelRewriteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceModelRewrite `json:"items"`
}

// InferenceModelRewriteSpec is the desired state of an InferenceModelRewrite.
type InferenceModelRewriteSpec struct {
	// PoolRef is the pool whose requests are rewritten.
	//
	// +required
	PoolRef PoolObjectReference `json:"poolRef"`

	// Rules are tried in order; the first whose match fits the request wins.
	//
	// +required
	Rules []xv1alpha2.InferenceModelRewriteRule `json:"rules"`
}

// InferenceModelRewriteStatus is the observed state of an InferenceModelRewrite.
type InferenceModelRewriteStatus struct {
	// Conditions of the rewrite; known type: Accepted.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:default={{type: "Ready", status: "Unknown", reason: "Pending", message: "Waiting for controller", lastTransitionTime: "1970-01-01T00:00:00Z"}}
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PoolObjectReference names the InferencePool an object applies to, in the
// object's own namespace. The group defaults to llm-d.ai, as in the llm-d
// router's CRDs; poolpicker reads llm-d.ai and inference.networking.k8s.io
// alike as the InferencePool it serves.
type PoolObjectReference struct {
	// Group of the pool; defaults to "llm-d.ai".
	//
	// +optional
	// +kubebuilder:default="llm-d.ai"
	Group v1.Group `json:"group,omitempty"`

	// Kind of the pool; defaults to "InferencePool".
	//
	// +optional
	// +kubebuilder:default="InferencePool"
	Kind v1.Kind `json:"kind,omitempty"`

	// Name of the pool.
	//
	// +required
	Name v1.ObjectName `json:"name"`
}
