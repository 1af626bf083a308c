// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package samples_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/poolpicker/poolpicker/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env, testenv.Options{})) }

// TestSamplesApply creates every object of every sample file on a real API
// server: a sample the CRDs reject fails here.
func TestSamplesApply(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples found: %v", err)
	}
	ns := env.Namespace(t, "samples")
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
			n := 0
			for {
				u := &unstructured.Unstructured{}
				if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				if len(u.Object) == 0 {
					continue
				}
				u.SetNamespace(ns)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := env.Client.Create(ctx, u)
				cancel()
				if err != nil {
					t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
				}
				n++
			}
			if n == 0 {
				t.Fatal("no objects in sample")
			}
		})
	}
}
