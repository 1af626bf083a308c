// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InferencePool is a group of model-server pods that share a base model and
// an endpoint picker; a gateway routes to it as a backend and asks the picker
// which pod serves each request.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=infpool
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"
type InferencePool struct {
	metav1.TypeMeta `json:",inline"`

	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the pool.
	//
	// +required
	Spec InferencePoolSpec `json:"spec,omitzero"`

	// Status is the observed state of the pool.
	//
	// +optional
	Status InferencePoolStatus `json:"status,omitempty"`
}

// InferencePoolList is a list of InferencePools.
//
// +kubebuilder:object:root=true
type InferencePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferencePool `json:"items"`
}

// InferencePoolSpec is the desired state of an InferencePool.
type InferencePoolSpec struct {
	// Selector picks the pool's pods by label, in the pool's namespace only.
	//
	// +required
	Selector LabelSelector `json:"selector,omitzero"`

	// TargetPorts are the model-server ports of each selected pod; every port
	// of every pod is a distinct endpoint, addressed as podIP:port.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:message="port number must be unique",rule="self.all(p1, self.exists_one(p2, p1.number==p2.number))"
	// +listType=atomic
	// +required
	TargetPorts []Port `json:"targetPorts,omitempty"`

	// AppProtocol is the application protocol of all target ports: "http"
	// (HTTP/1.1, the default) or "kubernetes.io/h2c" (HTTP/2 cleartext).
	//
	// +kubebuilder:validation:Enum=http;"kubernetes.io/h2c"
	// +kubebuilder:default="http"
	// +optional
	AppProtocol AppProtocol `json:"appProtocol,omitempty"`

	// EndpointPickerRef names the endpoint picker serving this pool.
	//
	// +optional
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// Port is a network port of the pool's pods.
type Port struct {
	// Number is the port number, 1 to 65535.
	//
	// +required
	Number PortNumber `json:"number,omitempty"`
}

// AppProtocol is the application protocol spoken on a pool's target ports.
type AppProtocol string

const (
	// AppProtocolHTTP is HTTP/1.1, the default.
	AppProtocolHTTP AppProtocol = "http"
	// AppProtocolH2C is HTTP/2 over cleartext.
	AppProtocolH2C AppProtocol = "kubernetes.io/h2c"
)

// EndpointPickerRef refers to the endpoint picker extension of a pool.
//
// +kubebuilder:validation:XValidation:rule="self.kind != 'Service' || has(self.port)",message="port is required when kind is 'Service' or unspecified (defaults to 'Service')"
type EndpointPickerRef struct {
	// Group is the API group of the referent; "" (the default) is the core group.
	//
	// +optional
	// +kubebuilder:default=""
	Group *Group `json:"group,omitempty"`

	// Kind is the kind of the referent; defaults to "Service". ExternalName
	// Services are not supported.
	//
	// +optional
	// +kubebuilder:default=Service
	Kind Kind `json:"kind,omitempty"`

	// Name is the name of the referent.
	//
	// +required
	Name ObjectName `json:"name,omitempty"`

	// Port is the Service port of the picker (not its target port); required
	// when the referent is a Service.
	//
	// +optional
	Port *Port `json:"port,omitempty"`

	// FailureMode says what the gateway does when the picker does not answer;
	// defaults to "FailClose".
	//
	// +optional
	// +kubebuilder:default="FailClose"
	FailureMode EndpointPickerFailureMode `json:"failureMode,omitempty"`
}

// EndpointPickerFailureMode says how a gateway behaves when the picker fails.
//
// +kubebuilder:validation:Enum=FailOpen;FailClose
type EndpointPickerFailureMode string

const (
	// EndpointPickerFailOpen lets the gateway pick an endpoint itself.
	EndpointPickerFailOpen EndpointPickerFailureMode = "FailOpen"
	// EndpointPickerFailClose makes the gateway drop the request.
	EndpointPickerFailClose EndpointPickerFailureMode = "FailClose"
)

// InferencePoolStatus is the observed state of an InferencePool.
type InferencePoolStatus struct {
	// Parents is the status of the pool as seen by each parent (usually a
	// Gateway), at most 32.
	//
	// +kubebuilder:validation:MaxItems=32
	// +optional
	// +listType=atomic
	Parents []ParentStatus `json:"parents,omitempty"`
}

// ParentStatus is the status of a pool with respect to one parent.
type ParentStatus struct {
	// Conditions of the pool for this parent: Accepted, ResolvedRefs, Exported.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ParentRef identifies the parent.
	//
	// +required
	ParentRef ParentReference `json:"parentRef,omitzero"`

	// ControllerName is the DOMAIN/PATH name of the controller that wrote
	// this entry.
	//
	// +optional
	ControllerName ControllerName `json:"controllerName,omitempty"`
}

// ControllerName is a domain-prefixed path naming a controller, e.g.
// "example.com/gateway-controller".
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$`
type ControllerName string

// ParentReference identifies a parent of a pool, usually a Gateway.
type ParentReference struct {
	// Group of the parent; defaults to "gateway.networking.k8s.io".
	//
	// +optional
	// +kubebuilder:default="gateway.networking.k8s.io"
	Group *Group `json:"group,omitempty"`

	// Kind of the parent; defaults to "Gateway".
	//
	// +optional
	// +kubebuilder:default=Gateway
	Kind Kind `json:"kind,omitempty"`

	// Name of the parent.
	//
	// +required
	Name ObjectName `json:"name,omitempty"`

	// Namespace of the parent; the pool's namespace when unset.
	//
	// +optional
	Namespace Namespace `json:"namespace,omitempty"`
}

// Condition types and reasons of InferencePool status.
const (
	ConditionAccepted     = "Accepted"
	ConditionResolvedRefs = "ResolvedRefs"
	ConditionExported     = "Exported"

	ReasonAccepted             = "Accepted"
	ReasonNotSupportedByParent = "NotSupportedByParent"
	ReasonHTTPRouteNotAccepted = "HTTPRouteNotAccepted"
	ReasonResolvedRefs         = "ResolvedRefs"
	ReasonInvalidExtensionRef  = "InvalidExtensionRef"
	ReasonPending              = "Pending"
)
