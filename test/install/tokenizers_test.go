// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/poolpicker/poolpicker/internal/deploytest"
)

// TestChartTokenizers: tokenizers mounts a ConfigMap's tokenizer.json files
// or a volume of them read-only at mountPath, where the precise scorer's
// local tokenizers are discovered; both at once fail the render.
func TestChartTokenizers(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	for _, c := range []struct {
		name, values, source, want string
	}{
		{"ConfigMap", "tokenizers: {configMapName: tok, items: [{key: qwen3, path: Qwen/Qwen3-0.6B/tokenizer.json}]}\n", "configMap", "path:Qwen/Qwen3-0.6B/tokenizer.json"},
		{"volume", "tokenizers: {volume: {persistentVolumeClaim: {claimName: tokenizers}}, mountPath: /models}\n", "persistentVolumeClaim", "claimName:tokenizers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: c.values})
			if err != nil {
				t.Fatal(err)
			}
			deploy := deploytest.Find(objs, "Deployment", "poolpicker")
			containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
			mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
			volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
			wantPath := "/mnt/models"
			if c.name == "volume" {
				wantPath = "/models"
			}
			mounted := false
			for _, m := range mounts {
				mount := m.(map[string]any)
				if mount["name"] == "tokenizers" {
					mounted = mount["mountPath"] == wantPath && mount["readOnly"] == true
				}
			}
			if !mounted {
				t.Errorf("no read-only tokenizers mount at %s: %v", wantPath, mounts)
			}
			found := false
			for _, v := range volumes {
				vol := v.(map[string]any)
				if vol["name"] != "tokenizers" {
					continue
				}
				found = true
				if src := fmt.Sprint(vol[c.source]); !strings.Contains(src, c.want) {
					t.Errorf("volume %v: want a %s with %s", vol, c.source, c.want)
				}
			}
			if !found {
				t.Errorf("no tokenizers volume: %v", volumes)
			}
		})
	}
	if _, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "tokenizers: {configMapName: a, volume: {emptyDir: {}}}\n"}); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("render with both sources: %v, want an error saying not both", err)
	}
	// None by default.
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(deploytest.Find(objs, "Deployment", "poolpicker").Object), "tokenizers") {
		t.Error("the default render mounts tokenizers")
	}
}
