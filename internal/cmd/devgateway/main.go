// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command devgateway runs the development gateway: an HTTP server that routes
// OpenAI requests to InferencePools through an endpoint picker, reading
// Gateway API HTTPRoutes from the API server, as an Envoy gateway with the
// ext_proc filter does. It is a tool for local runs and tests, not a
// production gateway.
//
//	devgateway --kubeconfig /tmp/poolpicker-demo/kubeconfig --addr 127.0.0.1:8080 --epp-address 127.0.0.1:9002
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/internal/devgateway"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "devgateway:", err)
		os.Exit(2)
	}
}

// run parses args and serves until ctx ends. When ready is not nil it
// receives the listening address once routes are loaded.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("devgateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o devgateway.Options
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server holding the HTTPRoutes and InferencePools (default $KUBECONFIG)")
	fs.StringVar(&o.Addr, "addr", devgateway.DefaultAddr, "address to listen on for HTTP requests")
	gateway := fs.String("gateway", "", "only use HTTPRoutes attached to this Gateway, as namespace/name (default: every HTTPRoute)")
	fs.StringVar(&o.EPPAddress, "epp-address", devgateway.DefaultEPPAddress, "host:port of the endpoint picker's ext_proc port; every pool's endpointPickerRef Service is reached there, with the Service as :authority")
	fs.StringVar(&o.EPPHealthAddress, "epp-health-address", "", "host:port of the endpoint picker's gRPC health port: requests are held while its readiness is not SERVING, as a Service routes only to Ready pods (default: no readiness gating)")
	fs.BoolVar(&o.EPPPlaintext, "epp-plaintext", false, "dial the endpoint picker without TLS (for poolpicker --secure-serving=false)")
	fs.DurationVar(&o.ExtProcRetryWindow, "extproc-retry-window", devgateway.DefaultExtProcRetryWindow, "how long requests wait and retry while the endpoint picker is unreachable (negative: no retry)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", devgateway.DefaultConnectTimeout, "timeout of each upstream connection attempt")
	fs.IntVar(&o.MaxRequestBodyBytes, "max-request-body-bytes", devgateway.DefaultMaxRequestBodyBytes, "largest request body the gateway reads")
	verbosity := fs.Int("v", 0, "log verbosity (2: route changes, 4: one line per request)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *kubeconfig == "" {
		return errors.New("--kubeconfig (or $KUBECONFIG) is required: the gateway reads its routes from the API server")
	}
	if _, _, err := net.SplitHostPort(o.EPPAddress); err != nil {
		return fmt.Errorf("--epp-address %q: %w", o.EPPAddress, err)
	}
	if *gateway != "" {
		ns, name, ok := strings.Cut(*gateway, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--gateway %q: want namespace/name", *gateway)
		}
		o.Gateway = types.NamespacedName{Namespace: ns, Name: name}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %s: %w", *kubeconfig, err)
	}
	o.Logger = funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})
	ctrllog.SetLogger(o.Logger.WithName("k8s"))
	g, err := devgateway.New(cfg, o)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Start(ctx) }()
	select {
	case <-g.Ready():
		if ready != nil {
			ready <- g.Addr()
		}
	case err := <-errc:
		return err
	}
	return <-errc
}
