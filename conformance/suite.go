// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package conformance checks an endpoint picker's side of the Inference
// Extension's EPP protocol black-box, over its ext_proc and health ports,
// with pools and pods it creates on a real API server and model servers it
// runs on loopback.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// Part is the part of the contract a case checks.
type Part string

const (
	// Protocol is what the Inference Extension's EPP protocol document
	// (docs/proposals/004-endpoint-picker-protocol) says a picker MUST do:
	// the destination header and envoy.lb metadata, the subset hint and its
	// 503, the served-endpoint metadata. The document states no SHOULD.
	Protocol Part = "protocol MUST"
	// Interop is what the protocol document does not ask but gateways and
	// the Inference Extension's own chart rely on: stream shapes other than
	// full-duplex streaming (BUFFERED, NGINX Gateway Fabric's), requests
	// without a body, comma-joined subset entries, the health services the
	// chart's probes name.
	Interop Part = "gateway interoperability"
	// SuiteBehaviour is what the Inference Extension's conformance suite
	// asks of its picker (test-epp-endpoint-selection, the served endpoint
	// echoed); pickers turn it on for that suite only.
	SuiteBehaviour Part = "conformance-suite behaviour"
	// Extension is poolpicker's: many pools on one picker, its error bodies.
	Extension Part = "poolpicker extension"
)

// Status of a case.
type Status string

const (
	// Passed means every check of the case held.
	Passed Status = "passed"
	// Failed means a check did not hold; the case's Detail says which.
	Failed Status = "failed"
	// Skipped means the case does not apply to the picker under test.
	Skipped Status = "skipped"
)

// Pool names the suite creates in Options.Namespace. A single-pool picker
// is started for PrimaryPool, with its EPP Service PrimaryService.
const (
	PrimaryPool    = "conformance-primary"
	PrimaryService = "conformance-primary-epp"
	SecondPool     = "conformance-second"
	SecondService  = "conformance-second-epp"
	EmptyPool      = "conformance-empty"
	EmptyService   = "conformance-empty-epp"
	// SharedPoolPrefix names the three pools that share the primary pool's
	// pods on other ports (-0, -1, -2).
	SharedPoolPrefix = "conformance-shared"
	// UnscrapedPool's pod has no model server: its load is unknown, so its
	// sheddable requests (objective SheddableObjective) are shed.
	UnscrapedPool    = "conformance-unscraped"
	UnscrapedService = "conformance-unscraped-epp"
	// SheddableObjective is an InferenceObjective (llm-d.ai/v1alpha2) of
	// UnscrapedPool with a negative priority.
	SheddableObjective = "conformance-sheddable"
	// DPPool has three target ports per pod (data-parallel ranks).
	DPPool    = "conformance-dp"
	DPService = "conformance-dp-epp"
	// ServicePort is every pool's endpointPickerRef port.
	ServicePort = 9002
)

// Options configure a Run. Zero values are the documented defaults.
type Options struct {
	// EPPAddr is the picker's ext_proc address (host:port). Required.
	EPPAddr string
	// HealthAddr is its gRPC health address. Empty: the health cases skip.
	HealthAddr string
	// TLS dials ext_proc over TLS without verifying the certificate.
	TLS bool
	// Config reaches the API server the picker watches. Required.
	Config *rest.Config
	// Namespace the pools and pods are created in; it must exist. Required.
	Namespace string
	// FirstIP is the loopback address of the first pod; the next 9 follow.
	// Empty: 127.0.60.2.
	FirstIP string
	// Parts are the parts the picker claims. Empty: Protocol only.
	Parts []Part
	// MultiPool says the picker serves every pool of Namespace, not just
	// PrimaryPool; false skips the cases that need more than one pool.
	MultiPool bool
	// MaxBodyBytes is the picker's request body limit; zero skips the 413 case.
	MaxBodyBytes int
	// Ready bounds the wait for the picker to route the suite's pools.
	// Zero: 60s.
	Ready time.Duration
}

// Outcome is one case's result.
type Outcome struct {
	Name      string
	Part      Part
	MultiPool bool
	Status    Status
	// Detail says why a case failed or was skipped.
	Detail string
}

// Env is what cases use: the picker's client and the pools' endpoints.
type Env struct {
	opts   Options
	client *eppclient.Client
	k8s    client.Client
	// pods are the IPs of the primary pool's pods, in order.
	pods []string
	// secondPods are the second pool's.
	secondPods []string
	// dpPods are the data-parallel pool's.
	dpPods  []string
	servers []*modelsim.Server
}

// Port numbers of the model servers.
const (
	primaryPort = 8000
	secondPort  = 8000
)

// sharedPorts are the target ports of the three shared pools.
var sharedPorts = []int{8001, 8002, 8003}

// dpPorts are the data-parallel pool's target ports.
var dpPorts = []int{8100, 8101, 8102}

// Run creates the suite's objects, runs every case and returns their
// outcomes in order; it removes what it created. An error means the suite
// could not run at all.
func Run(ctx context.Context, opts Options) ([]Outcome, error) {
	if opts.EPPAddr == "" || opts.Config == nil || opts.Namespace == "" {
		return nil, errors.New("conformance: EPPAddr, Config and Namespace are required")
	}
	if opts.FirstIP == "" {
		opts.FirstIP = "127.0.60.2"
	}
	if len(opts.Parts) == 0 {
		opts.Parts = []Part{Protocol}
	}
	if opts.Ready == 0 {
		opts.Ready = 60 * time.Second
	}
	e, err := setUp(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer e.tearDown()
	var out []Outcome
	for _, c := range Cases() {
		out = append(out, e.run(ctx, c))
	}
	return out, nil
}

func (e *Env) run(ctx context.Context, c Case) Outcome {
	o := Outcome{Name: c.Name, Part: c.Part, MultiPool: c.MultiPool}
	claimed := false
	for _, p := range e.opts.Parts {
		claimed = claimed || p == c.Part
	}
	switch {
	case !claimed:
		o.Status, o.Detail = Skipped, "the picker does not claim "+string(c.Part)
	case c.MultiPool && !e.opts.MultiPool:
		o.Status, o.Detail = Skipped, "needs a multi-pool picker"
	case c.Needs != nil && c.Needs(e.opts) != "":
		o.Status, o.Detail = Skipped, c.Needs(e.opts)
	default:
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := c.Run(cctx, e); err != nil {
			o.Status, o.Detail = Failed, err.Error()
		} else {
			o.Status = Passed
		}
	}
	return o
}

// Report writes outcomes as a table and a summary line.
func Report(w io.Writer, outcomes []Outcome) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tPART\tRESULT\tDETAIL")
	n := map[Status]int{}
	for _, o := range outcomes {
		n[o.Status]++
		detail := strings.ReplaceAll(o.Detail, "\n", " ")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", o.Name, o.Part, o.Status, detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", n[Passed], n[Failed], n[Skipped])
	return err
}

// Markdown writes outcomes as a Markdown table (the site's report).
func Markdown(w io.Writer, outcomes []Outcome) error {
	if _, err := fmt.Fprintln(w, "| case | part | result |\n| --- | --- | --- |"); err != nil {
		return err
	}
	for _, o := range outcomes {
		if _, err := fmt.Fprintf(w, "| %s | %s | %s |\n", o.Name, o.Part, o.Status); err != nil {
			return err
		}
	}
	return nil
}

func setUp(ctx context.Context, opts Options) (_ *Env, err error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := llmdv1alpha2.AddToScheme(s); err != nil {
		return nil, err
	}
	k, err := client.New(opts.Config, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("conformance: API client: %w", err)
	}
	e := &Env{opts: opts, k8s: k, client: eppclient.New(opts.EPPAddr, eppclient.Options{TLS: opts.TLS})}
	defer func() {
		if err != nil {
			e.tearDown()
		}
	}()
	ip := net.ParseIP(opts.FirstIP).To4()
	if ip == nil {
		return nil, fmt.Errorf("conformance: FirstIP %q is not an IPv4 address", opts.FirstIP)
	}
	nextIP := func() string {
		s := ip.String()
		ip = net.IPv4(ip[0], ip[1], ip[2], ip[3]+1).To4()
		return s
	}
	// Three pods for the primary pool (also serving the shared pools'
	// ports), three for the second pool, three data-parallel ones.
	for i := 0; i < 3; i++ {
		a := nextIP()
		if err := e.pod(ctx, fmt.Sprintf("primary-%d", i), a, map[string]string{"conformance": "primary"}, append([]int{primaryPort}, sharedPorts...)); err != nil {
			return nil, err
		}
		e.pods = append(e.pods, a)
	}
	for i := 0; i < 3; i++ {
		a := nextIP()
		if err := e.pod(ctx, fmt.Sprintf("second-%d", i), a, map[string]string{"conformance": "second"}, []int{secondPort}); err != nil {
			return nil, err
		}
		e.secondPods = append(e.secondPods, a)
	}
	for i := 0; i < 3; i++ {
		a := nextIP()
		if err := e.pod(ctx, fmt.Sprintf("dp-%d", i), a, map[string]string{"conformance": "dp"}, dpPorts); err != nil {
			return nil, err
		}
		e.dpPods = append(e.dpPods, a)
	}
	// A Ready pod nobody serves: its metrics never arrive.
	unscraped := nextIP()
	if err := e.pod(ctx, "unscraped-0", unscraped, map[string]string{"conformance": "unscraped"}, nil); err != nil {
		return nil, err
	}
	pools := []struct {
		name, svc, app string
		ports          []int
	}{
		{UnscrapedPool, UnscrapedService, "unscraped", []int{primaryPort}},
		{PrimaryPool, PrimaryService, "primary", []int{primaryPort}},
		{SecondPool, SecondService, "second", []int{secondPort}},
		{EmptyPool, EmptyService, "nobody", []int{primaryPort}},
		{DPPool, DPService, "dp", dpPorts},
	}
	for i, p := range sharedPorts {
		pools = append(pools, struct {
			name, svc, app string
			ports          []int
		}{fmt.Sprintf("%s-%d", SharedPoolPrefix, i), fmt.Sprintf("%s-%d-epp", SharedPoolPrefix, i), "primary", []int{p}})
	}
	for _, p := range pools {
		pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: p.name}}
		pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"conformance": v1.LabelValue(p.app)}
		for _, port := range p.ports {
			pool.Spec.TargetPorts = append(pool.Spec.TargetPorts, v1.Port{Number: v1.PortNumber(port)})
		}
		pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: v1.ObjectName(p.svc), Port: &v1.Port{Number: ServicePort}}
		if err := k.Create(ctx, pool); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("conformance: creating pool %s: %w", p.name, err)
		}
	}
	prio := -1
	obj := &llmdv1alpha2.InferenceObjective{ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: SheddableObjective},
		Spec: llmdv1alpha2.InferenceObjectiveSpec{Priority: &prio, PoolRef: llmdv1alpha2.PoolObjectReference{Name: UnscrapedPool}}}
	if err := k.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("conformance: creating InferenceObjective %s: %w", SheddableObjective, err)
	}
	// Ready: the picker routes the primary pool (and with MultiPool the
	// second one) to their pods.
	deadline := time.Now().Add(opts.Ready)
	wait := []struct{ svc, pod string }{{PrimaryService, e.pods[0]}}
	if opts.MultiPool {
		wait = append(wait, struct{ svc, pod string }{SecondService, e.secondPods[0]}, struct{ svc, pod string }{DPService, e.dpPods[0]})
	}
	for _, w := range wait {
		gap := 10 * time.Millisecond
		for {
			res, err := e.client.Do(ctx, eppclient.Request{Authority: e.authority(w.svc), Body: completion()})
			if err == nil && res.Immediate == nil && len(res.Endpoints()) > 0 {
				break
			}
			if time.Now().After(deadline) && err != nil {
				return nil, fmt.Errorf("conformance: the picker did not route pool of Service %s within %s: %w", w.svc, opts.Ready, err)
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("conformance: the picker did not route pool of Service %s within %s (last answer: %+v)", w.svc, opts.Ready, res)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(gap):
			}
			gap = min(2*gap, 200*time.Millisecond)
		}
	}
	return e, nil
}

// pod runs model servers on ip at ports and creates a Ready pod for them.
func (e *Env) pod(ctx context.Context, name, ip string, labels map[string]string, ports []int) error {
	for _, p := range ports {
		srv, err := modelsim.New(modelsim.Options{Addr: net.JoinHostPort(ip, fmt.Sprint(p)), Model: "m"})
		if err != nil {
			return err
		}
		if err := srv.Start(context.Background()); err != nil {
			return fmt.Errorf("conformance: model server on %s:%d: %w", ip, p, err)
		}
		e.servers = append(e.servers, srv)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.opts.Namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Image: "modelsim"}}}}
	if err := e.k8s.Create(ctx, pod); err != nil {
		return fmt.Errorf("conformance: creating pod %s: %w", name, err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	if err := e.k8s.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("conformance: marking pod %s ready: %w", name, err)
	}
	return nil
}

func (e *Env) tearDown() {
	_ = e.client.Close()
	for _, s := range e.servers {
		s.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = e.k8s.DeleteAllOf(ctx, &v1.InferencePool{}, client.InNamespace(e.opts.Namespace))
	_ = e.k8s.DeleteAllOf(ctx, &llmdv1alpha2.InferenceObjective{}, client.InNamespace(e.opts.Namespace))
	_ = e.k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(e.opts.Namespace), client.MatchingLabels{})
}

// authority is kgateway's :authority form of svc in the suite's namespace.
func (e *Env) authority(svc string) string {
	return fmt.Sprintf("%s.%s.svc:%d", svc, e.opts.Namespace, ServicePort)
}

func completion() []byte { return []byte(`{"model":"m","prompt":"hello"}`) }
