// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

func validPool(ns, name string) *v1.InferencePool {
	return &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "vllm"}},
			TargetPorts:       []v1.Port{{Number: 8000}},
			EndpointPickerRef: &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}},
		},
	}
}

func TestInferencePoolValidation(t *testing.T) {
	ns := env.Namespace(t, "crd")
	manyLabels := func(n int) map[v1.LabelKey]v1.LabelValue {
		m := map[v1.LabelKey]v1.LabelValue{}
		for i := 0; i < n; i++ {
			m[v1.LabelKey("k"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26)))] = "v"
		}
		return m
	}
	ports := func(nums ...int32) []v1.Port {
		var ps []v1.Port
		for _, n := range nums {
			ps = append(ps, v1.Port{Number: v1.PortNumber(n)})
		}
		return ps
	}
	cases := []struct {
		name    string
		mutate  func(p *v1.InferencePool)
		wantErr string // empty: accepted
	}{
		{name: "valid minimal", mutate: func(p *v1.InferencePool) {}},
		{name: "no endpointPickerRef is allowed", mutate: func(p *v1.InferencePool) { p.Spec.EndpointPickerRef = nil }},
		{name: "zero target ports", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = nil }, wantErr: "spec.targetPorts: Required value"},
		{name: "empty target ports list", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = []v1.Port{} }, wantErr: "spec.targetPorts: Required value"},
		{name: "eight target ports", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(1, 2, 3, 4, 5, 6, 7, 8) }},
		{name: "nine target ports", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(1, 2, 3, 4, 5, 6, 7, 8, 9) }, wantErr: "spec.targetPorts: Too many: 9: must have at most 8 items"},
		{name: "duplicate port numbers", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(8000, 80, 8000) }, wantErr: "spec.targetPorts: Invalid value: port number must be unique"},
		{name: "port zero", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(0) }, wantErr: "spec.targetPorts[0].number: Required value"},
		{name: "port above 65535", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(65536) }, wantErr: "spec.targetPorts[0].number: Invalid value: 65536: spec.targetPorts[0].number in body should be less than or equal to 65535"},
		{name: "negative port", mutate: func(p *v1.InferencePool) { p.Spec.TargetPorts = ports(-1) }, wantErr: "spec.targetPorts[0].number in body should be greater than or equal to 1"},
		{name: "zero matchLabels", mutate: func(p *v1.InferencePool) { p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{} }, wantErr: "spec.selector.matchLabels: Required value"},
		{name: "64 matchLabels", mutate: func(p *v1.InferencePool) { p.Spec.Selector.MatchLabels = manyLabels(64) }},
		{name: "65 matchLabels", mutate: func(p *v1.InferencePool) { p.Spec.Selector.MatchLabels = manyLabels(65) }, wantErr: "spec.selector.matchLabels: Too many: 65: must have at most 64 items"},
		{name: "label key with prefix", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app.kubernetes.io/name": "vllm"}
		}},
		// Label keys are not checked, as in upstream's CRD: a pool upstream
		// accepts is accepted, and the picker reports a key no selector can
		// hold (controllers' TestInvalidSelectorKeyReported).
		{name: "label key with invalid character", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app~": "vllm"}
		}},
		{name: "label key ending with dot", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"example.com.": "vllm"}
		}},
		{name: "label key name over 63 characters", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{v1.LabelKey(strings.Repeat("a", 64)): "vllm"}
		}},
		{name: "empty label value", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": ""}
		}},
		{name: "label value with invalid character", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "v llm"}
		}, wantErr: "spec.selector.matchLabels.app: Invalid value: \"v llm\": spec.selector.matchLabels.app in body should match '^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'"},
		{name: "label value over 63 characters", mutate: func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": v1.LabelValue(strings.Repeat("a", 64))}
		}, wantErr: "spec.selector.matchLabels.app: Too long: may not be more than 63 bytes"},
		{name: "service picker without port", mutate: func(p *v1.InferencePool) {
			p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Kind: "Service", Name: "epp"}
		}, wantErr: "spec.endpointPickerRef: Invalid value: port is required when kind is 'Service' or unspecified (defaults to 'Service')"},
		{name: "unset kind without port", mutate: func(p *v1.InferencePool) {
			p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp"}
		}, wantErr: "port is required when kind is 'Service' or unspecified (defaults to 'Service')"},
		{name: "non-service picker without port", mutate: func(p *v1.InferencePool) {
			p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Group: ptr.To(v1.Group("example.com")), Kind: "Picker", Name: "epp"}
		}},
		{name: "picker without name", mutate: func(p *v1.InferencePool) { p.Spec.EndpointPickerRef.Name = "" }, wantErr: "spec.endpointPickerRef.name: Required value"},
		{name: "bad failure mode", mutate: func(p *v1.InferencePool) { p.Spec.EndpointPickerRef.FailureMode = "Sometimes" }, wantErr: "spec.endpointPickerRef.failureMode: Unsupported value: \"Sometimes\": supported values: \"FailOpen\", \"FailClose\""},
		{name: "bad kind", mutate: func(p *v1.InferencePool) { p.Spec.EndpointPickerRef.Kind = "1Service" }, wantErr: "spec.endpointPickerRef.kind in body should match"},
		{name: "bad group", mutate: func(p *v1.InferencePool) { p.Spec.EndpointPickerRef.Group = ptr.To(v1.Group("Not_A_Group")) }, wantErr: "spec.endpointPickerRef.group in body should match"},
		{name: "bad appProtocol", mutate: func(p *v1.InferencePool) { p.Spec.AppProtocol = "grpc" }, wantErr: "spec.appProtocol: Unsupported value: \"grpc\": supported values: \"http\", \"kubernetes.io/h2c\""},
		{name: "h2c appProtocol", mutate: func(p *v1.InferencePool) { p.Spec.AppProtocol = v1.AppProtocolH2C }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p := validPool(ns, fmt.Sprintf("case-%d", i))
			tc.mutate(p)
			err := env.Client.Create(ctx, p)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want rejected with %q, got accepted", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}

func TestInferencePoolDefaults(t *testing.T) {
	ns := env.Namespace(t, "crd-defaults")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := validPool(ns, "defaults")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	var got v1.InferencePool
	if err := env.Client.Get(ctx, client_key(p), &got); err != nil {
		t.Fatal(err)
	}
	ref := got.Spec.EndpointPickerRef
	if ref.Kind != "Service" || ref.Group == nil || *ref.Group != "" || ref.FailureMode != v1.EndpointPickerFailClose {
		t.Errorf("endpointPickerRef defaults: kind=%q group=%v failureMode=%q, want Service, \"\", FailClose", ref.Kind, ref.Group, ref.FailureMode)
	}
	if got.Spec.AppProtocol != v1.AppProtocolHTTP {
		t.Errorf("appProtocol default = %q, want http", got.Spec.AppProtocol)
	}

	// Status is a subresource: an update of the main resource ignores it.
	got.Status.Parents = []v1.ParentStatus{{ParentRef: v1.ParentReference{Name: "gw"}}}
	if err := env.Client.Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	var again v1.InferencePool
	if err := env.Client.Get(ctx, client_key(p), &again); err != nil {
		t.Fatal(err)
	}
	if len(again.Status.Parents) != 0 {
		t.Errorf("status changed through the main resource: %+v", again.Status)
	}
	again.Status.Parents = []v1.ParentStatus{{ParentRef: v1.ParentReference{Name: "gw"}, ControllerName: "example.com/gateway"}}
	if err := env.Client.Status().Update(ctx, &again); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client_key(p), &again); err != nil {
		t.Fatal(err)
	}
	pr := again.Status.Parents[0].ParentRef
	if pr.Kind != "Gateway" || pr.Group == nil || *pr.Group != "gateway.networking.k8s.io" {
		t.Errorf("parentRef defaults: kind=%q group=%v", pr.Kind, pr.Group)
	}
	again.Status.Parents[0].ControllerName = "no-path"
	err := env.Client.Status().Update(ctx, &again)
	if err == nil || !strings.Contains(err.Error(), "status.parents[0].controllerName: Invalid value: \"no-path\": parents[0].controllerName in body should match") {
		t.Errorf("controllerName without path: got %v", err)
	}
}

// TestInferencePoolRawValidation sends JSON the Go types cannot express
// (an explicit empty map, a string where a number belongs).
func TestInferencePoolRawValidation(t *testing.T) {
	ns := env.Namespace(t, "crd-raw")
	cases := []struct {
		name    string
		spec    map[string]any
		wantErr string
	}{
		{name: "empty matchLabels", spec: map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{}}, "targetPorts": []any{map[string]any{"number": 8000}},
		}, wantErr: "spec.selector.matchLabels: Invalid value: 0: spec.selector.matchLabels in body should have at least 1 properties"},
		{name: "no selector", spec: map[string]any{"targetPorts": []any{map[string]any{"number": 8000}}}, wantErr: "spec.selector: Required value"},
		{name: "port as string", spec: map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}, "targetPorts": []any{map[string]any{"number": "8000"}},
		}, wantErr: "spec.targetPorts[0].number: Invalid value: \"string\": spec.targetPorts[0].number in body must be of type integer"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1.GroupVersion.String(), "kind": "InferencePool",
				"metadata": map[string]any{"namespace": ns, "name": fmt.Sprintf("raw-%d", i)},
				"spec":     tc.spec,
			}}
			err := env.Client.Create(ctx, u)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}
