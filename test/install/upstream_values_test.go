// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/deploytest"
)

// upstreamValue is one row of testdata/upstream-values.yaml: an upstream
// chart value and poolpicker's equivalent, or why there is none.
type upstreamValue struct {
	Upstream    string         `json:"upstream"`
	Poolpicker  string         `json:"poolpicker"`
	Values      string         `json:"values"`
	Expect      []renderedWant `json:"expect"`
	Note        string         `json:"note"`
	Unsupported string         `json:"unsupported"`
	Outside     bool           `json:"outside"`
}

// renderedWant is what an object of Kind holds at Path once rendered: a
// value equal to Equals, or a list containing Contains.
type renderedWant struct {
	Kind     string `json:"kind"`
	Path     string `json:"path"`
	Equals   any    `json:"equals"`
	Contains string `json:"contains"`
}

// upstreamCharts are the charts of the mapping, in the page's order.
var upstreamCharts = []string{"inferencepool", "llm-d-router"}

func readUpstreamValues(t *testing.T) map[string][]upstreamValue {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rows map[string][]upstreamValue
	if err := yaml.UnmarshalStrict(b, &rows); err != nil {
		t.Fatalf("testdata/upstream-values.yaml: %v", err)
	}
	for _, c := range upstreamCharts {
		if len(rows[c]) == 0 {
			t.Fatalf("testdata/upstream-values.yaml has no rows for %s", c)
		}
	}
	return rows
}

// pageRow is the start of the migration page's table row for v.
func pageRow(v upstreamValue) string {
	target := "not supported"
	switch {
	case v.Poolpicker != "":
		target = codeList(v.Poolpicker)
	case v.Outside:
		target = "not in this chart"
	}
	return "| " + codeList(v.Upstream) + " | " + target + " |"
}

// codeList writes "a, b" as "`a`, `b`".
func codeList(s string) string {
	parts := strings.Split(s, ", ")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ", ")
}

// TestUpstreamValuesMapping renders charts/poolpicker with the values each
// supported row of the upstream mapping names and checks what the rows say
// the rendered objects hold; every row, supported or not, has its row on
// site-src/migrating.md, and an unsupported one says why.
func TestUpstreamValuesMapping(t *testing.T) {
	rows := readUpstreamValues(t)
	page, err := os.ReadFile(filepath.Join(root, "site-src", "migrating.md"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 15*time.Minute)
	for _, chart := range upstreamCharts {
		for _, v := range rows[chart] {
			t.Run(chart+"/"+v.Upstream, func(t *testing.T) {
				if !strings.Contains(string(page), pageRow(v)) {
					t.Errorf("site-src/migrating.md has no row starting %q", pageRow(v))
				}
				if v.Poolpicker == "" {
					if v.Unsupported == "" || v.Values != "" || len(v.Expect) > 0 {
						t.Fatal("a row without a poolpicker value says why (unsupported) and renders nothing")
					}
					return
				}
				if v.Values == "" || len(v.Expect) == 0 || v.Unsupported != "" {
					t.Fatal("a supported row names the values it renders and what it expects")
				}
				objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: v.Values})
				if err != nil {
					t.Fatalf("render with %s: %v", v.Values, err)
				}
				for _, w := range v.Expect {
					if err := holds(objs, w); err != nil {
						t.Errorf("with %s: %v", v.Values, err)
					}
				}
			})
		}
	}
}

// holds says whether some rendered object of w.Kind holds w.
func holds(objs []*unstructured.Unstructured, w renderedWant) error {
	var seen []string
	for _, o := range objs {
		if o.GetKind() != w.Kind {
			continue
		}
		got, err := lookup(o.Object, w.Path)
		if err != nil {
			seen = append(seen, fmt.Sprintf("%s: %v", o.GetName(), err))
			continue
		}
		if w.Contains != "" {
			list, ok := got.([]any)
			if !ok {
				seen = append(seen, fmt.Sprintf("%s: %s is %T, not a list", o.GetName(), w.Path, got))
				continue
			}
			for _, item := range list {
				if item == w.Contains {
					return nil
				}
			}
			seen = append(seen, fmt.Sprintf("%s: %q", o.GetName(), list))
			continue
		}
		if equal(got, w.Equals) {
			return nil
		}
		seen = append(seen, fmt.Sprintf("%s: %v", o.GetName(), got))
	}
	if len(seen) == 0 {
		return fmt.Errorf("no %s rendered", w.Kind)
	}
	want := fmt.Sprintf("equal to %v", w.Equals)
	if w.Contains != "" {
		want = fmt.Sprintf("containing %q", w.Contains)
	}
	return fmt.Errorf("no %s with %s %s; rendered: %s", w.Kind, w.Path, want, strings.Join(seen, "; "))
}

// equal compares a rendered value with the row's, numbers by value.
func equal(got, want any) bool {
	if g, ok := toFloat(got); ok {
		w, ok := toFloat(want)
		return ok && g == w
	}
	return reflect.DeepEqual(got, want)
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case int:
		return float64(n), true
	}
	return 0, false
}

// lookup follows a dotted path (a number indexes a list, \. is a dot
// inside a key) into an object.
func lookup(obj any, path string) (any, error) {
	cur := obj
	for _, key := range splitPath(path) {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[key]
			if !ok {
				return nil, fmt.Errorf("no %q in %s", key, path)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(key)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("no item %s of %d in %s", key, len(c), path)
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("%s: %q reaches a %T", path, key, cur)
		}
	}
	return cur, nil
}

func splitPath(path string) []string {
	var keys []string
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		switch {
		case path[i] == '\\' && i+1 < len(path) && path[i+1] == '.':
			b.WriteByte('.')
			i++
		case path[i] == '.':
			keys = append(keys, b.String())
			b.Reset()
		default:
			b.WriteByte(path[i])
		}
	}
	return append(keys, b.String())
}

func TestLookup(t *testing.T) {
	obj := map[string]any{"spec": map[string]any{"a.b": []any{map[string]any{"c": int64(3)}}}}
	if v, err := lookup(obj, `spec.a\.b.0.c`); err != nil || v != int64(3) {
		t.Errorf("lookup = %v, %v; want 3", v, err)
	}
	for _, bad := range []string{"spec.x", `spec.a\.b.1.c`, `spec.a\.b.z`, `spec.a\.b.0.c.d`} {
		if _, err := lookup(obj, bad); err == nil {
			t.Errorf("lookup(%s): no error", bad)
		}
	}
}

// TestRBACRoleNameAsDocumented: the install page names the Role of the
// release's own namespace `<fullname>-ha`; rendered under a release whose
// name does not contain the chart's, and under one that does, the Role is
// the chart's full name with -ha.
func TestRBACRoleNameAsDocumented(t *testing.T) {
	if !strings.Contains(section(t, installPage(t), "RBAC"), "the Role `<fullname>-ha`") {
		t.Fatal("the install page's RBAC section no longer names the Role `<fullname>-ha`: update this test with it")
	}
	ctx := ctxT(t, 5*time.Minute)
	for release, fullname := range map[string]string{"edge": "edge-poolpicker", "poolpicker-b": "poolpicker-b"} {
		objs, err := tool.Chart(ctx, deploytest.ChartOptions{Release: release})
		if err != nil {
			t.Fatal(err)
		}
		var roles []string
		for _, o := range objs {
			if o.GetKind() == "Role" {
				roles = append(roles, o.GetName())
			}
		}
		if len(roles) != 1 || roles[0] != fullname+"-ha" {
			t.Errorf("release %s: Roles %v, want [%s-ha]", release, roles, fullname)
		}
	}
}
