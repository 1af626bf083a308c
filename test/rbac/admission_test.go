// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package rbac

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/internal/testenv"
)

// admissionTestNamespace prefixes the namespace of
// TestAdmissionPolicyRefusesForeignWrites, whose refused requests the
// whole-flow tests do not count.
const admissionTestNamespace = "admission-tenant"

// ownedLabel is the label the admission policy of config/deploy/base
// requires on every Service and EndpointSlice the picker writes.
var ownedLabel = map[string]string{"app.kubernetes.io/managed-by": "poolpicker"}

// TestAdmissionPolicyRefusesForeignWrites: with the ClusterRole and the
// ValidatingAdmissionPolicy of config/deploy/base applied as rendered, the
// picker's ServiceAccount may create, change and delete the Services and
// EndpointSlices it labels as its own, and nothing else: a tenant's own
// Service and EndpointSlice cannot be created, changed (not even to adopt
// them with the label), or deleted with its token, which RBAC alone allows.
// An administrator's writes are not matched.
func TestAdmissionPolicyRefusesForeignWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := stack.Client()
	cfg, err := stack.Env.ServiceAccountConfig(ctx, saNamespace, saName)
	if err != nil {
		t.Fatal(err)
	}
	picker, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := stack.Env.Namespace(t, admissionTestNamespace)

	service := func(name string, lbls map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8000}}}}
	}
	slice := func(name string, lbls map[string]string) *discoveryv1.EndpointSlice {
		l := map[string]string{discoveryv1.LabelServiceName: "tenant"}
		for k, v := range lbls {
			l[k] = v
		}
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}
	}
	// The tenant's own objects, made by someone the policy does not match.
	tenantSvc, tenantSlice := service("tenant", nil), slice("tenant", nil)
	for _, o := range []client.Object{tenantSvc, tenantSlice} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("an administrator's write is refused: %v", err)
		}
	}

	refused := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "app.kubernetes.io/managed-by=poolpicker")
	}
	// The policy is enforced once the API server has compiled it; until then
	// (just after the stack applied it) an unlabelled create may pass, and
	// is removed to try again.
	eventually(t, "the picker's unlabelled Service create refused by the policy", func() bool {
		o := service("unlabelled", nil)
		err := picker.Create(ctx, o)
		if err == nil {
			_ = admin.Delete(ctx, o)
		}
		return refused(err)
	})

	adopted := tenantSvc.DeepCopy()
	adopted.Labels = ownedLabel
	adoptedSlice := tenantSlice.DeepCopy()
	adoptedSlice.Labels["app.kubernetes.io/managed-by"] = "poolpicker"
	for _, tc := range []struct {
		what string
		do   func() error
	}{
		{"create an unlabelled EndpointSlice", func() error { return picker.Create(ctx, slice("unlabelled", nil)) }},
		{"adopt the tenant's Service by labelling it", func() error { return picker.Update(ctx, adopted) }},
		{"adopt the tenant's EndpointSlice by labelling it", func() error { return picker.Update(ctx, adoptedSlice) }},
		{"delete the tenant's Service", func() error { return picker.Delete(ctx, service("tenant", nil)) }},
		{"delete the tenant's EndpointSlice", func() error { return picker.Delete(ctx, slice("tenant", nil)) }},
	} {
		if err := tc.do(); !refused(err) {
			t.Errorf("the picker may %s: got %v, want the policy's refusal", tc.what, err)
		}
	}
	for _, o := range []client.Object{service("tenant", nil), slice("tenant", nil)} {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("the tenant's %T is gone: %v", o, err)
		} else if o.GetLabels()["app.kubernetes.io/managed-by"] != "" {
			t.Errorf("the tenant's %T was labelled: %v", o, o.GetLabels())
		}
	}

	// Its own objects: created, changed and deleted.
	for _, o := range []client.Object{service("owned", ownedLabel), slice("owned", ownedLabel)} {
		if err := picker.Create(ctx, o); err != nil {
			t.Fatalf("the picker cannot create its own %T: %v", o, err)
		}
		lbls := o.GetLabels()
		lbls["poolpicker.io/pool"] = "chat"
		o.SetLabels(lbls)
		if err := picker.Update(ctx, o); err != nil {
			t.Errorf("the picker cannot update its own %T: %v", o, err)
		}
		if err := picker.Delete(ctx, o); err != nil {
			t.Errorf("the picker cannot delete its own %T: %v", o, err)
		}
	}
}
