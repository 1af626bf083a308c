// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

// Command localdemo is what `make run` runs: poolpicker end to end on this
// machine, with no cluster, container runtime or GPU. It starts a real
// control plane (etcd, kube-apiserver from bin/), applies the CRDs and the
// manifests of config/samples/local (two namespaces, three InferencePools,
// one of LoRA adapters), runs each model-server Deployment's replicas as
// simulated vLLM servers on their own loopback IPs (127.0.0.2, ...) with
// Ready Pod objects, starts one poolpicker process for all pools and the
// development gateway, and prints curl commands to try. Ctrl-C stops every
// process it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/labels"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/modelsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "localdemo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("localdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o localstack.Options
	fs.StringVar(&o.Dir, "dir", "", "directory for the kubeconfig, the poolpicker binary and its log (default: a temporary directory removed on exit)")
	fs.StringVar(&o.GatewayAddr, "gateway-addr", localstack.DefaultGatewayAddr, "address of the development gateway")
	fs.StringVar(&o.FirstIP, "first-ip", localstack.DefaultFirstIP, "loopback IP of the first simulated pod; the others follow")
	fs.IntVar(&o.GRPCPort, "grpc-port", localstack.DefaultGRPCPort, "poolpicker's ext_proc port")
	fs.IntVar(&o.HealthPort, "grpc-health-port", localstack.DefaultHealthPort, "poolpicker's gRPC health port")
	fs.IntVar(&o.MetricsPort, "metrics-port", localstack.DefaultMetricsPort, "poolpicker's metrics port")
	pickerArgs := fs.String("poolpicker-args", "", "extra poolpicker flags, space-separated (e.g. \"-v=4\")")
	buildFlags := fs.String("poolpicker-build-flags", "", "extra go build flags for poolpicker, space-separated (e.g. \"-race\")")
	fs.StringVar(&o.PickerBinary, "poolpicker-binary", "", "a poolpicker binary to run (default: build ./cmd/poolpicker)")
	verbosity := fs.Int("v", 0, "log verbosity of the demo and the gateway (2: pods and route changes, 4: every request)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.PickerArgs = strings.Fields(*pickerArgs)
	o.PickerBuildFlags = strings.Fields(*buildFlags)
	o.Logger = funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})
	ctrllog.SetLogger(o.Logger.WithName("k8s").V(1))

	fmt.Fprintln(stdout, "Starting the local control plane, the sample pools, their simulated model servers, poolpicker and the development gateway...")
	s, err := localstack.Start(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(stdout, "\nStopping the gateway, poolpicker, the model servers and the control plane...")
		if err := s.Stop(); err != nil {
			fmt.Fprintln(stderr, "localdemo:", err)
		}
		fmt.Fprintln(stdout, "Stopped.")
	}()
	if err := printGuide(ctx, stdout, s, o); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// poolInfo is what the guide says about a pool.
type poolInfo struct {
	pool     v1.InferencePool
	host     string
	model    string
	adapters []string
	ips      []string
}

func printGuide(ctx context.Context, w io.Writer, s *localstack.Stack, o localstack.Options) error {
	var pools v1.InferencePoolList
	if err := s.Env.Client.List(ctx, &pools); err != nil {
		return err
	}
	var routes gwv1.HTTPRouteList
	if err := s.Env.Client.List(ctx, &routes); err != nil {
		return err
	}
	var infos []poolInfo
	for _, p := range pools.Items {
		info := poolInfo{pool: p}
		for _, r := range routes.Items {
			for _, rule := range r.Spec.Rules {
				for _, b := range rule.BackendRefs {
					if string(b.Name) == p.Name && r.Namespace == p.Namespace && len(r.Spec.Hostnames) > 0 {
						info.host = string(r.Spec.Hostnames[0])
					}
				}
			}
		}
		sel := labels.Set{}
		for k, v := range p.Spec.Selector.MatchLabels {
			sel[string(k)] = string(v)
		}
		for _, d := range s.Deployments() {
			pods := s.Pods(d)
			if d.Namespace != p.Namespace || len(pods) == 0 {
				continue
			}
			dep := s.Deployment(d)
			if dep == nil || !labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
				continue
			}
			for _, pod := range pods {
				info.ips = append(info.ips, pod.IP)
			}
			st := pods[0].Server
			info.model, info.adapters = modelOf(st)
		}
		infos = append(infos, info)
	}
	sort.Slice(infos, func(i, j int) bool {
		return infos[i].pool.Namespace+"/"+infos[i].pool.Name < infos[j].pool.Namespace+"/"+infos[j].pool.Name
	})

	gw := s.GatewayURL
	fmt.Fprintf(w, "\npoolpicker is running locally: %d InferencePools, one poolpicker process for all of them.\n\n", len(infos))
	fmt.Fprintf(w, "  gateway     %s  (development gateway, routes from HTTPRoutes; not for production)\n", gw)
	fmt.Fprintf(w, "  poolpicker  ext_proc 127.0.0.1:%d (TLS), health :%d, metrics http://127.0.0.1:%d/metrics\n", o.GRPCPort, o.HealthPort, o.MetricsPort)
	fmt.Fprintf(w, "              log %s\n", s.Picker.Log)
	fmt.Fprintf(w, "  kubeconfig  %s\n", s.Kubeconfig)
	fmt.Fprintf(w, "              e.g. kubectl --kubeconfig %s get inferencepools,pods -A -o wide\n\n", s.Kubeconfig)
	for _, in := range infos {
		fmt.Fprintf(w, "InferencePool %s/%s: model %s", in.pool.Namespace, in.pool.Name, in.model)
		if len(in.adapters) > 0 {
			fmt.Fprintf(w, ", LoRA adapters %s", strings.Join(in.adapters, ", "))
		}
		fmt.Fprintf(w, "; pods on %s port %d; host %s\n", strings.Join(in.ips, ", "), in.pool.Spec.TargetPorts[0].Number, in.host)
		model := in.model
		if len(in.adapters) > 0 {
			model = in.adapters[0]
		}
		fmt.Fprintf(w, "  curl -si %s/v1/completions -H 'Host: %s' -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"%s\",\"prompt\":\"Write a haiku about GPUs\",\"max_tokens\":24}'\n", gw, in.host, model)
		fmt.Fprintf(w, "  curl -sN %s/v1/chat/completions -H 'Host: %s' -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":24,\"stream\":true}'\n", gw, in.host, in.model)
		if slices.Contains(in.adapters, "food-review-1") {
			fmt.Fprintf(w, "  # \"food-review\" is rewritten to adapter food-review-1 (90%%) or food-review-2 (10%%):\n")
			fmt.Fprintf(w, "  curl -si %s/v1/completions -H 'Host: %s' -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"food-review\",\"prompt\":\"Rate this pizza\",\"max_tokens\":16}'\n", gw, in.host)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "The response header x-devgateway-endpoint names the pod that served a request; x-devgateway-pool the pool.\n")
	fmt.Fprintf(w, "Add -H 'x-llm-d-inference-objective: batch' to a chat.team-a.example request to make it sheddable (429 when the pool is saturated).\n")
	fmt.Fprintf(w, "Pool metrics: curl -s http://127.0.0.1:%d/metrics | grep ^inference_pool\n\n", o.MetricsPort)
	fmt.Fprintln(w, "Press Ctrl-C to stop everything.")
	return nil
}

func modelOf(s *modelsim.Server) (string, []string) {
	o := s.Options()
	return o.Model, o.LoRAAdapters
}
