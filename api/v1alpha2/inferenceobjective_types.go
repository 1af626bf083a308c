// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1alpha2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
