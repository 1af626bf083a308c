// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1

// Group is the API group of a referent; "" is the core group.
//
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
type Group string

// Kind is the kind of a referent, e.g. "Service".
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
type Kind string

// ObjectName is the name of a referent.
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
type ObjectName string

// Namespace is the namespace of a referent (an RFC 1123 label).
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
type Namespace string

// PortNumber is a TCP port number.
//
// +kubebuilder:validation:Minimum=1
// +kubebuilder:validation:Maximum=65535
type PortNumber int32

// LabelKey is the key of a label: an optional DNS-subdomain prefix and a "/",
// then a name of at most 63 characters. Keys are validated by a rule on the
// map that holds them, because a schema cannot constrain map keys.
type LabelKey string

// LabelValue is the value of a label: at most 63 characters, empty or
// beginning and ending with an alphanumeric, with '-', '_' and '.' between.
//
// +kubebuilder:validation:MinLength=0
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
type LabelValue string

// LabelSelector selects pods by label equality, like a Service selector.
type LabelSelector struct {
	// MatchLabels are the {key,value} pairs a pod must all carry to be selected.
	// Keys are not checked by the CRD, as upstream's are not: a pool whose
	// key the API server refuses in a label selector is reported by the
	// picker (Event PodsNotListed, 503 for its requests).
	//
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	MatchLabels map[LabelKey]LabelValue `json:"matchLabels,omitempty"`
}
