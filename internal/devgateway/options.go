// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"net"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

// Defaults of Options.
const (
	DefaultAddr                = "127.0.0.1:8080"
	DefaultEPPAddress          = "127.0.0.1:9002"
	DefaultExtProcRetryWindow  = 30 * time.Second
	DefaultConnectTimeout      = 2 * time.Second
	DefaultMaxRequestBodyBytes = 64 << 20
	DefaultBodyChunkBytes      = 16 << 10
)

// Options configure a Gateway. The zero value of every field means its
// documented default.
type Options struct {
	// Addr is the host:port the gateway listens on. Empty: 127.0.0.1:8080.
	// Ignored when Listener is set.
	Addr string
	// Listener, when set, is served instead of binding Addr.
	Listener net.Listener

	// Gateway, when set, restricts routing to HTTPRoutes with a parentRef to
	// this Gateway (a route's parentRef namespace defaults to its own).
	// Zero: every HTTPRoute is used.
	Gateway types.NamespacedName

	// EPPAddress is where every endpointPickerRef Service is reached
	// (host:port), since there is no cluster DNS locally: streams still
	// carry the Service as their :authority, so one picker process tells
	// the pools apart as it would behind per-pool Services. Empty:
	// 127.0.0.1:9002. ResolveEPP, when set, overrides it per Service.
	EPPAddress string
	// ResolveEPP maps a pool's endpointPickerRef (namespace, Service, port)
	// to a host:port to dial. Nil: EPPAddress for every Service.
	ResolveEPP func(namespace, service string, port int32) string
	// ResolveThroughEndpointSlices resolves each endpointPickerRef Service
	// as Envoy's EDS does: its ready EndpointSlice endpoints, spreading
	// streams over them round robin and moving to the next one when an
	// attempt fails, instead of EPPAddress or ResolveEPP. A slice's ready
	// condition stands for the picker's readiness (EPPHealthAddress is then
	// not needed).
	ResolveThroughEndpointSlices bool
	// SliceAddressMap, when set, maps an address listed in an EndpointSlice
	// to the IP to dial: the local stack's stand-in for the pod network,
	// since the API server refuses loopback addresses in EndpointSlices
	// while local replicas listen on loopback ones. Nil: dial as listed.
	SliceAddressMap func(ip string) string
	// EPPHealthAddress, when set, is the host:port of the picker's gRPC
	// health server (poolpicker --grpc-health-port). The gateway then sends
	// streams to the picker only while its "readiness" service is SERVING
	// and holds requests otherwise, as a cluster's Service routes only to
	// Ready picker pods. Empty: the picker is used whenever it accepts
	// connections. It applies to every address ResolveEPP returns.
	EPPHealthAddress string
	// Authority, when set, is the :authority of the ext_proc streams of a
	// pool whose endpointPickerRef is the Service (namespace, service,
	// port), as the gateway being stood in for spells it (Istio's
	// outbound|PORT||SVC.NS.svc.cluster.local, say). Nil: SVC.NS.svc:PORT,
	// as kgateway sends it.
	Authority func(namespace, service string, port int32) string
	// EPPPlaintext dials the picker without TLS (poolpicker
	// --secure-serving=false). Zero (false): TLS without certificate
	// verification, as gateways talk to an EPP by default.
	EPPPlaintext bool

	// ExtProcRetryWindow bounds how long a request waits and retries while
	// its picker is unreachable (e.g. restarting) before it is answered
	// 503 (or sent on to any pool endpoint, for FailOpen pools). Zero: 30s;
	// negative: no retry.
	ExtProcRetryWindow time.Duration
	// ConnectTimeout bounds each upstream connection attempt; a failed
	// attempt moves on to the next endpoint the picker returned. Zero: 2s.
	ConnectTimeout time.Duration
	// MaxRequestBodyBytes bounds request bodies the gateway reads; larger
	// ones get 413 from the gateway itself. Zero: 64 MiB, above the
	// picker's own limit so that the picker's 413 is what clients see.
	MaxRequestBodyBytes int
	// BodyChunkBytes is the size of the body chunks streamed to ext_proc.
	// Zero: 16 KiB.
	BodyChunkBytes int

	// Logger receives structured logs keyed pool and request. Zero: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() {
	if o.Addr == "" {
		o.Addr = DefaultAddr
	}
	if o.EPPAddress == "" {
		o.EPPAddress = DefaultEPPAddress
	}
	if o.ResolveEPP == nil {
		addr := o.EPPAddress
		o.ResolveEPP = func(string, string, int32) string { return addr }
	}
	if o.ExtProcRetryWindow == 0 {
		o.ExtProcRetryWindow = DefaultExtProcRetryWindow
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.MaxRequestBodyBytes <= 0 {
		o.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if o.BodyChunkBytes <= 0 {
		o.BodyChunkBytes = DefaultBodyChunkBytes
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
}
