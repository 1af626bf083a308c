// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podwatch

import (
	"errors"
	"net/http"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestStripPod(t *testing.T) {
	now := metav1.Now()
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{"big": "x"}, DeletionTimestamp: &now, ResourceVersion: "7",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:v0.10.0", Args: []string{"--model", "m", "--port", "8000"}, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.1", Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, Message: "long text"},
		}},
	}
	out, err := Strip(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"a": "b"}, DeletionTimestamp: &now},
		IP:         "10.0.0.1", Ready: true,
	}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("stripped pod\n%+v\nwant\n%+v", out, want)
	}
	if again, _ := Strip(out); again != out {
		t.Fatal("an already stripped pod was changed")
	}
	cp := want.DeepCopyObject().(*Pod)
	cp.Labels["a"] = "changed"
	if want.Labels["a"] != "b" {
		t.Fatal("DeepCopyObject shares the labels")
	}

	pod := func(ip string, ready, deleting bool) *Pod {
		p := &Pod{IP: ip, Ready: ready}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	cases := []struct {
		name string
		pod  *Pod
		want bool
	}{
		{"ready with IP", pod("10.0.0.1", true, false), true},
		{"not ready", pod("10.0.0.1", false, false), false},
		{"no IP", pod("", true, false), false},
		{"terminating", pod("10.0.0.1", true, true), false},
	}
	for _, tc := range cases {
		if got := tc.pod.IsEndpoint(); got != tc.want {
			t.Errorf("%s: IsEndpoint = %v, want %v", tc.name, got, tc.want)
		}
	}
	noReady, _ := Strip(&corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1"}})
	if noReady.(*Pod).IsEndpoint() {
		t.Error("a pod without a Ready condition is an endpoint")
	}
	if RelevantChange(pod("10.0.0.1", true, false), pod("10.0.0.1", true, false)) {
		t.Error("an unchanged pod counted as a change")
	}
	if !RelevantChange(pod("10.0.0.1", true, false), pod("10.0.0.1", false, false)) {
		t.Error("a readiness change was missed")
	}
}

func TestExpiredMeansRelist(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	tooLarge := apierrors.NewTimeoutError("too large", 1)
	tooLarge.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge}}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"expired", apierrors.NewResourceExpired("too old resource version"), true},
		// A 410 with reason Gone, as apierrors.NewGone (deprecated) makes it.
		{"gone", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonGone, Message: "gone"}}, true},
		{"too large resource version", tooLarge, true},
		{"forbidden", apierrors.NewForbidden(gr, "", errors.New("rbac")), false},
		{"server timeout", apierrors.NewServerTimeout(gr, "watch", 1), false},
		{"other", errors.New("connection reset"), false},
	}
	for _, tc := range cases {
		if got := expired(tc.err); got != tc.want {
			t.Errorf("%s: expired = %v, want %v", tc.name, got, tc.want)
		}
	}
}
