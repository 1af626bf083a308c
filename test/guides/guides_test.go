// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package guides_test checks the gateway guides' objects against a real API
// server with the Gateway API CRDs and poolpicker's CRDs installed.
package guides_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/internal/devgateway"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(func() int {
		root, err := testenv.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		crds, err := devgateway.CRDDir(context.Background(), root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return testenv.RunMain(m, &env, testenv.Options{ExtraCRDDirs: []string{crds}})
	}())
}

// gatewaySpecific marks a YAML block of a gateway's own API group, whose CRDs
// the test cannot install.
const gatewaySpecific = "# gateway-specific"

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestGuidesDryRun creates every object of the guides' YAML blocks with a
// server-side dry-run and strict field validation: a field or value the
// Gateway API or poolpicker CRDs reject fails here, naming the block.
func TestGuidesDryRun(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(env.Root, "site-src", "gateway-guides.md"))
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "guides")
	checked, skipped := 0, 0
	kinds := map[string]int{}
	for i, m := range yamlBlock.FindAllSubmatch(doc, -1) {
		block := m[1]
		if bytes.HasPrefix(block, []byte(gatewaySpecific)) {
			skipped++
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(block), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("block %d: %v", i, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if u.GetKind() != "GatewayClass" {
				u.SetNamespace(ns)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := env.Client.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict"))
			cancel()
			if err != nil {
				t.Errorf("block %d: %s %s: %v", i, u.GetKind(), u.GetName(), err)
			}
			checked++
			kinds[u.GetKind()]++
		}
	}
	// Six gateways: a Gateway and an HTTPRoute each, the shared pool and Service.
	if kinds["Gateway"] != 6 || kinds["HTTPRoute"] != 6 || kinds["InferencePool"] != 1 || kinds["Service"] != 1 {
		t.Errorf("objects checked by kind %v: want 6 Gateways, 6 HTTPRoutes, the InferencePool and its Service", kinds)
	}
	if skipped != 2 {
		t.Errorf("%d gateway-specific blocks skipped, want 2 (Istio, GKE)", skipped)
	}
	t.Logf("dry-run created %d objects; %d gateway-specific blocks not checkable here", checked, skipped)
}

// TestGuidesNameEveryGateway keeps the page's promise of a section per gateway.
func TestGuidesNameEveryGateway(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(env.Root, "site-src", "gateway-guides.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"Istio", "kgateway", "agentgateway", "Envoy AI Gateway", "NGINX Gateway Fabric", "GKE"} {
		if !strings.Contains(string(doc), "\n## "+g+"\n") {
			t.Errorf("no section for %s", g)
		}
	}
}
