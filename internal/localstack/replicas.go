// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package localstack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Defaults of the replicated picker (Options.PickerReplicas > 0).
const (
	DefaultPickerNamespace = "poolpicker-system"
	DefaultFirstPickerIP   = "127.0.100.2"
	// pickerName is poolpicker's default --picker-name, whose label its
	// pods carry.
	pickerName  = "poolpicker"
	pickerLabel = "poolpicker.io/picker"
)

// Replica is one poolpicker process of a replicated picker, with its Pod
// object, whose Ready condition follows the process's gRPC readiness as a
// kubelet's readiness probe would.
type Replica struct {
	Pod types.NamespacedName
	// IP is the loopback address the process listens on; PodIP is its Pod's
	// IP, listed in picker EndpointSlices (which may not hold loopback
	// addresses): 10.a.b.c for 127.a.b.c, routed back by PodNetwork.
	IP, PodIP string
	Process   *Process
	// MetricsAddr is its /metrics host:port.
	MetricsAddr string

	stack  *Stack
	cancel context.CancelFunc
	done   chan struct{}
}

// startReplicas creates the replicas' Pods, starts their readiness probes
// and processes, and returns once every replica is ready.
func (s *Stack) startReplicas(ctx context.Context, binary string, baseArgs []string) error {
	o := s.opts
	ip := net.ParseIP(o.FirstPickerIP).To4()
	if ip == nil || ip[0] != 127 {
		return fmt.Errorf("localstack: first picker IP %q is not an IPv4 loopback address", o.FirstPickerIP)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.PickerNamespace}}
	if err := s.Env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("localstack: namespace %s: %w", o.PickerNamespace, err)
	}
	for i := range o.PickerReplicas {
		addr := ip.String()
		ip = nextHost(ip)
		args := append([]string{
			"--bind-address=" + addr,
			"--picker-namespace=" + o.PickerNamespace,
			"--ha-enable-leader-election",
			"--provision-picker-services",
		}, baseArgs...)
		r := &Replica{
			Pod:         types.NamespacedName{Namespace: o.PickerNamespace, Name: fmt.Sprintf("poolpicker-%d", i+1)},
			IP:          addr,
			PodIP:       "10." + strings.TrimPrefix(addr, "127."),
			MetricsAddr: net.JoinHostPort(addr, fmt.Sprint(o.MetricsPort)),
			stack:       s,
			Process: &Process{Path: binary, Args: args, Log: filepath.Join(s.Dir, fmt.Sprintf("poolpicker-%d.log", i+1)),
				HealthAddr: net.JoinHostPort(addr, fmt.Sprint(o.HealthPort))},
		}
		if err := r.createPod(ctx); err != nil {
			return err
		}
		pctx, cancel := context.WithCancel(context.Background())
		r.cancel, r.done = cancel, make(chan struct{})
		go r.probe(pctx)
		s.Pickers = append(s.Pickers, r)
	}
	// Replicas start together, as a Deployment's do.
	errs := make(chan error, len(s.Pickers))
	for _, r := range s.Pickers {
		go func() { errs <- r.Process.Start(ctx) }()
	}
	var first error
	for range s.Pickers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (r *Replica) createPod(ctx context.Context) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Pod.Namespace, Name: r.Pod.Name, Labels: map[string]string{pickerLabel: pickerName, "app": "poolpicker"}},
		// As hardened as the manifests' pod, so that a namespace enforcing
		// the restricted Pod Security Standard (the manifests' own) admits it.
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "poolpicker", Image: "poolpicker", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	if err := r.stack.Env.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("localstack: creating pod %s: %w", r.Pod, err)
	}
	return r.setReady(ctx, false)
}

// setReady writes the Pod's IP and Ready condition.
func (r *Replica) setReady(ctx context.Context, ready bool) error {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	for {
		var pod corev1.Pod
		if err := r.stack.Env.Client.Get(ctx, client.ObjectKey(r.Pod), &pod); err != nil {
			return err
		}
		now := metav1.Now()
		pod.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: r.PodIP, PodIPs: []corev1.PodIP{{IP: r.PodIP}}, HostIP: "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: now}},
		}
		err := r.stack.Env.Client.Status().Update(ctx, &pod)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// probe follows the replica's readiness service and mirrors it on its Pod
// until ctx ends; an unreachable replica is not ready.
func (r *Replica) probe(ctx context.Context) {
	defer close(r.done)
	cc, err := grpc.NewClient("passthrough:///"+r.Process.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ready := false
	set := func(v bool) {
		if v == ready {
			return
		}
		if err := r.setReady(ctx, v); err == nil {
			ready = v
			r.stack.log.V(2).Info("picker replica readiness", "pod", r.Pod.String(), "ready", v)
		}
	}
	for ctx.Err() == nil {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		for err == nil {
			var resp *healthpb.HealthCheckResponse
			if resp, err = w.Recv(); err == nil {
				set(resp.GetStatus() == healthpb.HealthCheckResponse_SERVING)
			}
		}
		set(false)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// PodNetwork routes a replica's Pod IP (10.a.b.c) to the loopback address
// it listens on (127.a.b.c), as a pod network would route it: the
// development gateway's SliceAddressMap.
func PodNetwork(ip string) string {
	if rest, ok := strings.CutPrefix(ip, "10."); ok {
		return "127." + rest
	}
	return ip
}

// stopProbe ends the readiness probe.
func (r *Replica) stopProbe() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
}

// Leader reports whether the replica says it holds the lease (its
// poolpicker_leader gauge).
func (r *Replica) Leader() bool {
	resp, err := http.Get("http://" + r.MetricsAddr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), "\npoolpicker_leader 1\n")
}

// Replicas lists the replicated picker's replicas (none in single-picker
// mode).
func (s *Stack) Replicas() []*Replica { return s.Pickers }

// stopReplicas stops every replica (SIGTERM, so each drains) and its probe.
func (s *Stack) stopReplicas() error {
	var wg sync.WaitGroup
	errs := make([]error, len(s.Pickers))
	for i, r := range s.Pickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Process.Stop()
			r.stopProbe()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
