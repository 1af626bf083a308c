// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command eppconform runs the EPP conformance suite against an endpoint
// picker: given its ext_proc address and a kubeconfig of the API server it
// watches, it creates pools and pods in a namespace, runs model servers on
// loopback, checks the picker's answers and prints a report table.
//
//	eppconform --epp-addr=127.0.0.1:9002 --health-addr=127.0.0.1:9003 --kubeconfig=KUBECONFIG \
//	  --namespace=eppconform --parts=protocol,interop,suite,extension --multi-pool
//
// A single-pool picker is started for the pool conformance-primary (EPP
// Service conformance-primary-epp) in the namespace; without --multi-pool the
// cases that need more pools are skipped, not failed. It exits 1 when a case
// fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/poolpicker/poolpicker/conformance"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

var partNames = map[string]conformance.Part{
	"protocol":  conformance.Protocol,
	"interop":   conformance.Interop,
	"suite":     conformance.SuiteBehaviour,
	"extension": conformance.Extension,
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eppconform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o conformance.Options
	var kubeconfig, parts string
	var markdown bool
	fs.StringVar(&o.EPPAddr, "epp-addr", "127.0.0.1:9002", "The picker's ext_proc address.")
	fs.StringVar(&o.HealthAddr, "health-addr", "", "The picker's gRPC health address. Empty: the health cases are skipped.")
	fs.BoolVar(&o.TLS, "tls", true, "Dial ext_proc over TLS (the certificate is not verified, as gateways do not).")
	fs.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "Kubeconfig of the API server the picker watches.")
	fs.StringVar(&o.Namespace, "namespace", "eppconform", "Namespace of the suite's pools and pods; created when missing.")
	fs.StringVar(&o.FirstIP, "first-ip", "127.0.60.2", "Loopback address of the first model server; the suite uses the next 9 too.")
	fs.StringVar(&parts, "parts", "protocol", "Parts of the contract the picker claims, comma-separated: protocol (what the Inference Extension's EPP protocol document says a picker MUST do), interop (what gateways and the Inference Extension's chart rely on beyond it: BUFFERED and NGINX Gateway Fabric streams, requests without a body, comma-joined subset entries, the health services), suite (the Inference Extension conformance suite's test header and served-endpoint echo), extension (poolpicker's: many pools, error bodies).")
	fs.BoolVar(&o.MultiPool, "multi-pool", false, "The picker serves every pool of --namespace; without it the multi-pool cases are skipped.")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", 0, "The picker's request body limit, for the 413 case; 0 skips it.")
	fs.DurationVar(&o.Ready, "ready-timeout", 60*time.Second, "How long to wait for the picker to route the suite's pools.")
	fs.BoolVar(&markdown, "markdown", false, "Print the report as a Markdown table.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, p := range strings.Split(parts, ",") {
		part, ok := partNames[strings.TrimSpace(p)]
		if !ok {
			fmt.Fprintf(stderr, "eppconform: --parts: unknown part %q (want protocol, interop, suite, extension)\n", p)
			return 2
		}
		o.Parts = append(o.Parts, part)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "eppconform: kubeconfig: %v\n", err)
		return 2
	}
	o.Config = cfg
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "eppconform: %v\n", err)
		return 2
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		fmt.Fprintf(stderr, "eppconform: namespace %s: %v\n", o.Namespace, err)
		return 1
	}
	outcomes, err := conformance.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "eppconform: %v\n", err)
		return 1
	}
	if markdown {
		err = conformance.Markdown(stdout, outcomes)
	} else {
		err = conformance.Report(stdout, outcomes)
	}
	if err != nil {
		fmt.Fprintf(stderr, "eppconform: %v\n", err)
		return 1
	}
	for _, oc := range outcomes {
		if oc.Status == conformance.Failed {
			return 1
		}
	}
	return 0
}
