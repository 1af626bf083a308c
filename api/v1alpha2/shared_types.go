// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1alpha2

import v1 "github.com/poolpicker/poolpicker/api/v1"

// PoolObjectReference names the InferencePool an object applies to, in the
// object's own namespace.
type PoolObjectReference struct {
	// Group of the pool; defaults to "inference.networking.k8s.io".
	//
	// +optional
	// +kubebuilder:default="inference.networking.k8s.io"
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

// Condition types and reasons of InferenceObjective and InferenceModelRewrite status.
const (
	ConditionAccepted = "Accepted"

	ReasonAccepted     = "Accepted"
	ReasonPending      = "Pending"
	ReasonPoolNotFound = "PoolNotFound"
)
