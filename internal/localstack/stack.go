// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

// Package localstack runs poolpicker's whole local setup — a real control
// plane, the sample objects, simulated model-server pods on loopback IPs,
// one poolpicker process and the development gateway — for `make run` and
// the end-to-end tests.
//
// The control plane has no kubelet and no controllers, so the stack plays
// their part for model servers: every Deployment it is given runs its
// replicas as in-process simulators (package modelsim, parsing the
// container args) each on its own loopback IP, and gets a Pod object with
// that IP marked Ready through the status subresource.
package localstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/poolpicker/poolpicker/internal/devgateway"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// Defaults of Options.
const (
	DefaultFirstIP     = "127.0.0.2"
	DefaultGatewayAddr = "127.0.0.1:8080"
	DefaultGRPCPort    = 9002
	DefaultHealthPort  = 9003
	DefaultMetricsPort = 9090
	// DefaultGateway is the Gateway of the samples, which the development
	// gateway implements.
	DefaultGatewayNamespace = "default"
	DefaultGatewayName      = "inference-gateway"
)

// Options configure a Stack. The zero value of every field means its
// documented default.
type Options struct {
	// Root is the repository root. Empty: found from the working directory.
	Root string
	// Dir holds the kubeconfig, the poolpicker binary and its log. Empty: a
	// new temporary directory, removed by Stop.
	Dir string
	// SampleDir holds the manifests applied at start, in file-name order.
	// Empty: <Root>/config/samples/local.
	SampleDir string
	// FirstIP is the loopback address of the first simulated pod; later pods
	// take the following addresses. Empty: 127.0.0.2.
	FirstIP string
	// GatewayAddr is where the development gateway listens. Empty:
	// 127.0.0.1:8080.
	GatewayAddr string
	// GRPCPort, HealthPort and MetricsPort are poolpicker's ports (on all
	// interfaces, as it binds them). Zero: 9002, 9003, 9090.
	GRPCPort, HealthPort, MetricsPort int
	// PickerArgs are extra poolpicker flags, after the ones the stack sets.
	PickerArgs []string
	// PickerBinary is a poolpicker binary to run. Empty: built with `go build`
	// into Dir at start.
	PickerBinary string
	// PickerBuildFlags are extra `go build` flags for the poolpicker binary
	// (tests build it with -race, which also reuses the race-built packages
	// of the test run).
	PickerBuildFlags []string
	// Gateway tunes the development gateway; its Addr, EPPAddress, Gateway
	// and Logger are set by the stack.
	Gateway devgateway.Options
	// Sim, when set, adjusts each simulated server's options after its
	// Deployment's args are parsed (tests make servers faster or smaller).
	Sim func(deployment types.NamespacedName, o *modelsim.Options)
	// Logger receives the stack's and the gateway's logs. Zero: discard.
	Logger logr.Logger
	// ControlPlane tunes the control plane (CRD sources, API server flags);
	// the Gateway API CRDs are always added.
	ControlPlane testenv.Options
	// PickerReplicas, when positive, runs poolpicker as that many replicas
	// in PickerNamespace, each on its own loopback IP (from FirstPickerIP)
	// with a Pod object whose Ready condition follows its readiness, with
	// leader election and picker Service provisioning; the gateway then
	// reaches pickers through the provisioned Services' EndpointSlices
	// only. Zero: one process on all interfaces, dialed directly.
	PickerReplicas int
	// PickerNamespace holds the replicas. Empty: poolpicker-system.
	PickerNamespace string
	// FirstPickerIP is the first replica's loopback IP. Empty: 127.0.100.2.
	FirstPickerIP string
	// PickerKubeconfig, when set, is called once the samples are applied and
	// returns the kubeconfig poolpicker runs with (tests run it as a
	// ServiceAccount). Nil: the administrator's kubeconfig.
	PickerKubeconfig func(ctx context.Context, env *testenv.Env) (string, error)
}

func (o *Options) setDefaults() error {
	if o.Root == "" {
		root, err := testenv.RepoRoot()
		if err != nil {
			return err
		}
		o.Root = root
	}
	if o.SampleDir == "" {
		o.SampleDir = filepath.Join(o.Root, "config", "samples", "local")
	}
	if o.FirstIP == "" {
		o.FirstIP = DefaultFirstIP
	}
	if o.GatewayAddr == "" {
		o.GatewayAddr = DefaultGatewayAddr
	}
	if o.GRPCPort == 0 {
		o.GRPCPort = DefaultGRPCPort
	}
	if o.HealthPort == 0 {
		o.HealthPort = DefaultHealthPort
	}
	if o.MetricsPort == 0 {
		o.MetricsPort = DefaultMetricsPort
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.PickerNamespace == "" {
		o.PickerNamespace = DefaultPickerNamespace
	}
	if o.FirstPickerIP == "" {
		o.FirstPickerIP = DefaultFirstPickerIP
	}
	return nil
}

// Stack is a running local setup.
type Stack struct {
	opts Options
	log  logr.Logger
	// Env is the control plane; Env.Client knows the core, poolpicker and
	// Gateway API types.
	Env *testenv.Env
	// Dir holds the kubeconfig, binary and logs.
	Dir string
	// Kubeconfig is the path of an administrator kubeconfig for Env.
	Kubeconfig string
	// Gateway is the development gateway, serving at GatewayURL.
	Gateway    *devgateway.Gateway
	GatewayURL string
	// Picker is the poolpicker process (the first replica's, with
	// Options.PickerReplicas).
	Picker *Process
	// Pickers are the replicas, with Options.PickerReplicas.
	Pickers []*Replica

	tempDir   bool
	gwCancel  context.CancelFunc
	gwDone    chan error
	mu        sync.Mutex
	nextIP    net.IP
	deploys   map[types.NamespacedName]*deployment
	stopOnce  sync.Once
	stopErr   error
	applied   []string
	pickerArg []string
}

// Pod is one simulated model-server pod.
type Pod struct {
	Name   types.NamespacedName
	IP     string
	Server *modelsim.Server
}

type deployment struct {
	obj  *appsv1.Deployment
	pods []*Pod
	seq  int
}

// Start brings the whole setup up: control plane, sample objects, model
// servers and their pods, poolpicker (ready), then the gateway (ready). On
// error everything already started is stopped.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Stack{opts: opts, log: opts.Logger.WithName("localstack"), deploys: map[types.NamespacedName]*deployment{}}
	s.nextIP = net.ParseIP(opts.FirstIP).To4()
	if s.nextIP == nil {
		return nil, fmt.Errorf("localstack: first IP %q is not an IPv4 address", opts.FirstIP)
	}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	s.Dir = opts.Dir
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "poolpicker-local-"); err != nil {
			return nil, err
		}
		s.tempDir = true
	} else if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}

	// The poolpicker build (slow on a cold cache) overlaps the control plane.
	type built struct {
		path string
		err  error
	}
	binc := make(chan built, 1)
	go func() {
		if opts.PickerBinary != "" {
			binc <- built{path: opts.PickerBinary}
			return
		}
		p, err := BuildPicker(ctx, opts.Root, s.Dir, opts.PickerBuildFlags...)
		binc <- built{p, err}
	}()

	crds, err := devgateway.CRDDir(ctx, opts.Root)
	if err != nil {
		<-binc
		return nil, err
	}
	s.log.Info("starting the control plane (etcd, kube-apiserver)")
	cp := opts.ControlPlane
	cp.ExtraCRDDirs = append(append([]string(nil), cp.ExtraCRDDirs...), crds)
	env, err := testenv.Start(cp)
	if err != nil {
		<-binc
		return nil, err
	}
	s.Env = env
	if err := gwv1.Install(env.Scheme); err != nil {
		<-binc
		return nil, err
	}
	s.Kubeconfig = filepath.Join(s.Dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(env.Config, s.Kubeconfig); err != nil {
		<-binc
		return nil, fmt.Errorf("localstack: writing kubeconfig: %w", err)
	}
	if err := s.applySamples(ctx); err != nil {
		<-binc
		return nil, err
	}
	b := <-binc
	if b.err != nil {
		return nil, b.err
	}
	pickerKubeconfig := s.Kubeconfig
	if opts.PickerKubeconfig != nil {
		if pickerKubeconfig, err = opts.PickerKubeconfig(ctx, env); err != nil {
			return nil, fmt.Errorf("localstack: poolpicker's kubeconfig: %w", err)
		}
	}
	s.pickerArg = append([]string{
		"--kubeconfig=" + pickerKubeconfig,
		fmt.Sprintf("--grpc-port=%d", opts.GRPCPort),
		fmt.Sprintf("--grpc-health-port=%d", opts.HealthPort),
		fmt.Sprintf("--metrics-port=%d", opts.MetricsPort),
		// The local stack's tools and tests scrape without a token.
		"--metrics-endpoint-auth=false",
	}, opts.PickerArgs...)
	gwOpts := opts.Gateway
	if opts.PickerReplicas > 0 {
		s.log.Info("starting poolpicker replicas", "binary", b.path, "replicas", opts.PickerReplicas, "namespace", opts.PickerNamespace)
		if err := s.startReplicas(ctx, b.path, s.pickerArg); err != nil {
			return nil, err
		}
		s.Picker = s.Pickers[0].Process
		gwOpts.ResolveThroughEndpointSlices = true
		gwOpts.SliceAddressMap = PodNetwork
	} else {
		s.Picker = &Process{Path: b.path, Args: s.pickerArg, Log: filepath.Join(s.Dir, "poolpicker.log"), HealthAddr: fmt.Sprintf("127.0.0.1:%d", opts.HealthPort)}
		s.log.Info("starting poolpicker", "binary", b.path, "log", s.Picker.Log)
		if err := s.Picker.Start(ctx); err != nil {
			return nil, err
		}
		gwOpts.EPPAddress = fmt.Sprintf("127.0.0.1:%d", opts.GRPCPort)
		gwOpts.EPPHealthAddress = fmt.Sprintf("127.0.0.1:%d", opts.HealthPort)
	}
	gwOpts.Addr = opts.GatewayAddr
	gwOpts.Gateway = types.NamespacedName{Namespace: DefaultGatewayNamespace, Name: DefaultGatewayName}
	gwOpts.Logger = opts.Logger.WithName("devgateway")
	if slices.Contains(opts.PickerArgs, "--secure-serving=false") {
		gwOpts.EPPPlaintext = true
	}
	gw, err := devgateway.New(env.Config, gwOpts)
	if err != nil {
		return nil, err
	}
	gctx, cancel := context.WithCancel(context.Background())
	s.Gateway, s.gwCancel, s.gwDone = gw, cancel, make(chan error, 1)
	go func() { s.gwDone <- gw.Start(gctx) }()
	select {
	case <-gw.Ready():
	case err := <-s.gwDone:
		s.gwDone <- err
		return nil, fmt.Errorf("localstack: development gateway: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.GatewayURL = "http://" + gw.Addr()
	return s, nil
}

// applySamples creates every object of the sample directory's YAML files,
// in file-name order, then runs the Deployments.
func (s *Stack) applySamples(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(s.opts.SampleDir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("localstack: no sample manifests in %s", s.opts.SampleDir)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := s.Apply(ctx, b); err != nil {
			return fmt.Errorf("localstack: %s: %w", filepath.Base(f), err)
		}
		s.applied = append(s.applied, filepath.Base(f))
	}
	return nil
}

// Apply creates the objects of a multi-document YAML; Deployments also get
// their simulated pods.
func (s *Stack) Apply(ctx context.Context, manifest []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() == "Deployment" && u.GroupVersionKind().Group == "apps" {
			var d appsv1.Deployment
			if err := runtimeFromUnstructured(u, &d); err != nil {
				return err
			}
			if err := s.CreateDeployment(ctx, &d); err != nil {
				return err
			}
			continue
		}
		if err := s.Env.Client.Create(ctx, u); err != nil {
			return fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
}

// CreateDeployment creates the Deployment object and runs its replicas.
func (s *Stack) CreateDeployment(ctx context.Context, d *appsv1.Deployment) error {
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return fmt.Errorf("Deployment %s/%s has no container", d.Namespace, d.Name)
	}
	if d.Namespace == "" {
		d.Namespace = "default"
	}
	if err := s.Env.Client.Create(ctx, d); err != nil {
		return fmt.Errorf("Deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	key := types.NamespacedName{Namespace: d.Namespace, Name: d.Name}
	s.mu.Lock()
	s.deploys[key] = &deployment{obj: d}
	s.mu.Unlock()
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	return s.Scale(ctx, key, replicas)
}

// Pods returns a Deployment's running pods, oldest first.
func (s *Stack) Pods(deploy types.NamespacedName) []*Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.deploys[deploy]; ok {
		return slices.Clone(d.pods)
	}
	return nil
}

// Deployment returns a copy of a Deployment the stack runs, nil if none.
func (s *Stack) Deployment(key types.NamespacedName) *appsv1.Deployment {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.deploys[key]; ok {
		return d.obj.DeepCopy()
	}
	return nil
}

// Deployments lists the Deployments the stack runs.
func (s *Stack) Deployments() []types.NamespacedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []types.NamespacedName
	for k := range s.deploys {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// Scale runs replicas pods for the Deployment: new pods get a server on the
// next loopback IP and a Ready Pod object; removed pods (newest first) have
// their Pod deleted, then their server shut down gracefully (requests in
// progress finish), as a kubelet does on scale-down.
func (s *Stack) Scale(ctx context.Context, deploy types.NamespacedName, replicas int) error {
	s.mu.Lock()
	d, ok := s.deploys[deploy]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("localstack: no Deployment %s", deploy)
	}
	for len(s.Pods(deploy)) < replicas {
		if err := s.addPod(ctx, deploy, d); err != nil {
			return err
		}
	}
	var removed []*Pod
	s.mu.Lock()
	for len(d.pods) > replicas {
		removed = append(removed, d.pods[len(d.pods)-1])
		d.pods = d.pods[:len(d.pods)-1]
	}
	s.mu.Unlock()
	for _, p := range removed {
		if err := s.Env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: objectMeta(p.Name)}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("localstack: deleting pod %s: %w", p.Name, err)
		}
	}
	var wg sync.WaitGroup
	for _, p := range removed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_ = p.Server.Shutdown(sctx)
		}()
	}
	wg.Wait()
	return nil
}

func (s *Stack) allocIP() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ip := s.nextIP.String()
	s.nextIP = nextHost(s.nextIP)
	return ip
}

// nextHost is the IPv4 address after ip, skipping .255, .0 and .1 of each
// /24 (broadcast-looking, network and the usual host address).
func nextHost(ip net.IP) net.IP {
	n := slices.Clone(ip.To4())
	if n[3] < 254 {
		n[3]++
		return n
	}
	n[3] = 2
	for i := 2; i >= 0; i-- {
		n[i]++
		if n[i] != 0 {
			break
		}
	}
	return n
}

func (s *Stack) addPod(ctx context.Context, key types.NamespacedName, d *deployment) error {
	c := d.obj.Spec.Template.Spec.Containers[0]
	opts, _, err := modelsim.ParseArgs(c.Args, io.Discard)
	if err != nil {
		return fmt.Errorf("localstack: Deployment %s: container args %q: %w", key, c.Args, err)
	}
	_, port, _ := net.SplitHostPort(opts.Addr)
	s.mu.Lock()
	d.seq++
	name := fmt.Sprintf("%s-%d", key.Name, d.seq)
	s.mu.Unlock()
	ip := s.allocIP()
	opts.Addr = net.JoinHostPort(ip, port)
	opts.Name = key.Namespace + "/" + name
	opts.Seed += uint64(d.seq)
	if s.opts.Sim != nil {
		s.opts.Sim(key, &opts)
	}
	srv, err := modelsim.New(opts)
	if err != nil {
		return fmt.Errorf("localstack: Deployment %s: %w", key, err)
	}
	if err := srv.Start(context.Background()); err != nil {
		return fmt.Errorf("localstack: pod %s/%s on %s: %w (is another process using it?)", key.Namespace, name, opts.Addr, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: d.obj.Spec.Template.ObjectMeta,
		Spec:       *d.obj.Spec.Template.Spec.DeepCopy(),
	}
	pod.ObjectMeta = *pod.ObjectMeta.DeepCopy()
	pod.Name, pod.Namespace = name, key.Namespace
	if err := s.Env.Client.Create(ctx, pod); err != nil {
		srv.Stop()
		return fmt.Errorf("localstack: creating pod %s/%s: %w", key.Namespace, name, err)
	}
	now := metav1Now()
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  ip,
		PodIPs: []corev1.PodIP{{IP: ip}},
		HostIP: "127.0.0.1",
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if err := s.Env.Client.Status().Update(ctx, pod); err != nil {
		srv.Stop()
		return fmt.Errorf("localstack: marking pod %s/%s ready: %w", key.Namespace, name, err)
	}
	s.mu.Lock()
	d.pods = append(d.pods, &Pod{Name: types.NamespacedName{Namespace: key.Namespace, Name: name}, IP: ip, Server: srv})
	s.mu.Unlock()
	s.log.V(2).Info("pod running", "pod", key.Namespace+"/"+name, "ip", ip, "model", opts.Model)
	return nil
}

// RestartPicker stops poolpicker (SIGTERM, so it drains) and starts it
// again, returning once it is ready; replicas are restarted one after the
// other, each once the previous is ready again, as a rolling update does.
func (s *Stack) RestartPicker(ctx context.Context) error {
	procs := []*Process{s.Picker}
	if len(s.Pickers) > 0 {
		procs = procs[:0]
		for _, r := range s.Pickers {
			procs = append(procs, r.Process)
		}
	}
	for _, p := range procs {
		if err := p.Stop(); err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops the gateway, poolpicker, every model server and the control
// plane, and removes a temporary Dir.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		if s.gwCancel != nil {
			s.gwCancel()
			if err := <-s.gwDone; err != nil {
				errs = append(errs, fmt.Errorf("gateway: %w", err))
			}
		}
		if len(s.Pickers) > 0 {
			if err := s.stopReplicas(); err != nil {
				errs = append(errs, fmt.Errorf("poolpicker: %w", err))
			}
		} else if s.Picker != nil {
			if err := s.Picker.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("poolpicker: %w", err))
			}
		}
		s.mu.Lock()
		for _, d := range s.deploys {
			for _, p := range d.pods {
				p.Server.Stop()
			}
			d.pods = nil
		}
		s.mu.Unlock()
		if s.Env != nil {
			if err := s.Env.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("control plane: %w", err))
			}
		}
		if s.tempDir {
			_ = os.RemoveAll(s.Dir)
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// Client is the stack's API client.
func (s *Stack) Client() client.Client { return s.Env.Client }
