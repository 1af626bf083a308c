// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1alpha2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	Rules []InferenceModelRewriteRule `json:"rules"`
}

// InferenceModelRewriteRule rewrites requests that match to one of its targets.
type InferenceModelRewriteRule struct {
	// Matches select requests; a rule without matches applies to every request.
	//
	// +optional
	Matches []Match `json:"matches,omitempty"`

	// Targets are the models a matched request is sent to, one chosen per
	// request in proportion to its weight.
	//
	// +kubebuilder:validation:MinItems=1
	// +optional
	Targets []TargetModel `json:"targets,omitempty"`
}

// Match is a criterion on a request.
type Match struct {
	// Model matches the "model" field of the request body.
	//
	// +required
	Model ModelMatch `json:"model"`
}

// MatchType is how a string is compared.
//
// +kubebuilder:validation:Enum=Exact
type MatchType string

// MatchExact compares strings for equality.
const MatchExact MatchType = "Exact"

// ModelMatch matches a request's model name.
type ModelMatch struct {
	// Type of comparison; only "Exact", the default.
	//
	// +optional
	// +kubebuilder:default=Exact
	Type *MatchType `json:"type,omitempty"`

	// Value is the model name to compare with.
	//
	// +kubebuilder:validation:MinLength=1
	// +required
	Value string `json:"value"`
}

// TargetModel is a weighted model destination.
type TargetModel struct {
	// ModelRewrite is the model name written into a matched request.
	//
	// +required
	ModelRewrite string `json:"modelRewrite"`

	// Weight is this target's share: weight / sum of weights. Set on all
	// targets or on none (then equal shares).
	//
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight *int32 `json:"weight,omitempty"`
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
