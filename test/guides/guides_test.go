// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package guides_test runs the gateway guides: their objects are applied
// to a real API server with the Gateway API CRDs and poolpicker's CRDs,
// poolpicker runs as the default install configures it, and a request is
// routed through each guide's route by the development gateway, standing
// in for that gateway with the :authority the guide names.
package guides_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/internal/devgateway"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var stack *localstack.Stack

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The default install: two replicas in poolpicker-system with leader
	// election and provisioned picker Services, TLS on ext_proc, serving
	// the pools labelled poolpicker.io/picker=poolpicker. (Peer sync, also
	// on by default, shares picks between the replicas and routes nothing.)
	s, err := localstack.Start(context.Background(), localstack.Options{
		SampleDir:      filepath.Join(root, "test", "guides", "testdata"),
		FirstIP:        "127.0.47.2", // ranges of their own: other packages start pods at the same time
		PickerReplicas: 2,
		FirstPickerIP:  "127.0.48.2",
		GatewayAddr:    "127.0.0.1:0",
		GRPCPort:       ports[0], HealthPort: ports[1], MetricsPort: ports[2],
		PickerBuildFlags: []string{"-race"},
		Logger:           funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, p, a) }, funcr.Options{Verbosity: 0}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "guides: starting the local stack:", err)
		return 1
	}
	stack = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "guides: stopping the local stack:", err)
		code = 1
	}
	for _, r := range s.Replicas() {
		if logBytes, raced := testenv.RaceReported(r.Process.Log); raced {
			fmt.Fprintf(os.Stderr, "guides: poolpicker replica %s reported a data race:\n%s\n", r.Pod, logBytes)
			code = 1
		}
	}
	return code
}

// gatewaySpecific marks a YAML block of a gateway's own API group, whose CRDs
// the test cannot install.
const gatewaySpecific = "# gateway-specific"

var (
	yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")
	authority = regexp.MustCompile("`:authority` poolpicker sees: `([^`]+)`")
)

// guide is one section of the page.
type guide struct {
	name string
	// objects of its checkable YAML blocks; skipped counts the
	// gateway-specific ones.
	objects []*unstructured.Unstructured
	skipped int
	// authority is the :authority the section says poolpicker sees; empty
	// when it names none.
	authority string
}

// readGuides splits the page into its introduction (named "") and its
// "## " sections.
func readGuides(t *testing.T) []guide {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(stack.Env.Root, "site-src", "gateway-guides.md"))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(doc), "\n## ")
	var out []guide
	for i, part := range parts {
		g := guide{}
		if i > 0 {
			g.name, _, _ = strings.Cut(part, "\n")
		}
		if m := authority.FindStringSubmatch(part); m != nil {
			g.authority = m[1]
		}
		for _, m := range yamlBlock.FindAllStringSubmatch(part, -1) {
			if strings.HasPrefix(m[1], gatewaySpecific) {
				g.skipped++
				continue
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(m[1]), 4096)
			for {
				u := &unstructured.Unstructured{}
				if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("section %q: %v", g.name, err)
				}
				if len(u.Object) > 0 {
					g.objects = append(g.objects, u)
				}
			}
		}
		out = append(out, g)
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestGuidesDryRun creates every object of the guides' YAML blocks with a
// server-side dry-run and strict field validation in a namespace of its
// own: a field or value the Gateway API or poolpicker CRDs reject fails
// here, naming the section.
func TestGuidesDryRun(t *testing.T) {
	ns := stack.Env.Namespace(t, "guides")
	kinds := map[string]int{}
	skipped := 0
	for _, g := range readGuides(t) {
		skipped += g.skipped
		for _, o := range g.objects {
			u := o.DeepCopy()
			if u.GetKind() != "GatewayClass" {
				u.SetNamespace(ns)
			}
			if err := stack.Env.Client.Create(ctxT(t, 20*time.Second), u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
				t.Errorf("section %q: %s %s: %v", g.name, u.GetKind(), u.GetName(), err)
			}
			kinds[u.GetKind()]++
		}
	}
	// Six gateways: a Gateway and an HTTPRoute each, and the shared pool;
	// no picker Service, which poolpicker provisions.
	if kinds["Gateway"] != 6 || kinds["HTTPRoute"] != 6 || kinds["InferencePool"] != 1 || kinds["Service"] != 0 {
		t.Errorf("objects by kind %v: want 6 Gateways, 6 HTTPRoutes, the InferencePool and no Service", kinds)
	}
	if skipped != 2 {
		t.Errorf("%d gateway-specific blocks skipped, want 2 (Istio, GKE)", skipped)
	}
}

// TestGuidesNameEveryGateway keeps the page's promise of a section per gateway.
func TestGuidesNameEveryGateway(t *testing.T) {
	var names []string
	for _, g := range readGuides(t)[1:] {
		names = append(names, g.name)
	}
	for _, g := range []string{"Istio", "kgateway", "agentgateway", "Envoy AI Gateway", "NGINX Gateway Fabric", "GKE"} {
		if !strings.Contains("\n"+strings.Join(names, "\n")+"\n", "\n"+g+"\n") {
			t.Errorf("no section for %s among %q", g, names)
		}
	}
}

// TestGuidesRoute applies the page's pool as written, then each guide's
// objects in turn, and sends a request through the guide's route: the
// pool is served by the default install, its picker Service and
// EndpointSlice are provisioned, and the development gateway, with the
// guide's :authority, gets a vllm-chat pod's answer.
func TestGuidesRoute(t *testing.T) {
	guides := readGuides(t)
	ctx := ctxT(t, 10*time.Minute)
	for _, o := range guides[0].objects {
		if o.GetNamespace() != "inference" {
			t.Fatalf("the shared %s %s is in namespace %q, want inference (the guides' routes are)", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if err := stack.Env.Client.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	servers := map[string]bool{}
	for _, p := range stack.Pods(types.NamespacedName{Namespace: "inference", Name: "vllm-chat"}) {
		servers[p.IP] = true
	}
	if len(servers) == 0 {
		t.Fatal("no vllm-chat pod runs")
	}
	for _, g := range guides[1:] {
		t.Run(g.name, func(t *testing.T) {
			for _, o := range g.objects {
				u := o.DeepCopy()
				if err := stack.Env.Client.Create(ctx, u); err != nil {
					t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
				}
				t.Cleanup(func() {
					if err := stack.Env.Client.Delete(context.Background(), u); err != nil {
						t.Errorf("deleting %s %s: %v", u.GetKind(), u.GetName(), err)
					}
				})
			}
			url := startGateway(t, g)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
				bytes.NewReader([]byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Say hello","max_tokens":4}`)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served := resp.Header.Get(devgateway.HeaderServedEndpoint)
			host, _, _ := net.SplitHostPort(served)
			if resp.StatusCode != http.StatusOK || !servers[host] {
				t.Fatalf("%d from %q (want a vllm-chat pod of %v): %s", resp.StatusCode, served, servers, body)
			}
		})
	}
}

// startGateway runs a development gateway for the guide's Gateway
// (inference/inference-gateway), reaching poolpicker through the picker
// Services' EndpointSlices as Envoy's EDS does, with the guide's
// :authority; it returns the gateway's URL once its routes are loaded.
func startGateway(t *testing.T, g guide) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := devgateway.Options{
		Listener:                     lis,
		Gateway:                      types.NamespacedName{Namespace: "inference", Name: "inference-gateway"},
		ResolveThroughEndpointSlices: true,
		SliceAddressMap:              localstack.PodNetwork,
		// The picker Service is provisioned once the leader has seen the
		// pool: the first request waits for it.
		ExtProcRetryWindow: 60 * time.Second,
	}
	if g.authority != "" {
		a := g.authority
		opts.Authority = func(string, string, int32) string { return a }
	}
	gw, err := devgateway.New(stack.Env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("development gateway: %v", err)
		}
	})
	select {
	case <-gw.Ready():
	case err := <-done:
		done <- err
		t.Fatalf("development gateway: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the development gateway did not load its routes")
	}
	return "http://" + gw.Addr()
}
