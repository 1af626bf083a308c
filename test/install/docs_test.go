// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/permissions"
)

func installPage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "site-src", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of the "## title" section.
func section(t *testing.T, page, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(page, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("site-src/install.md has no section %q", title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// tableColumn returns the first column of a section's table rows, without
// backticks.
func tableColumn(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		out = append(out, strings.Trim(strings.TrimSpace(cells[1]), "`"))
	}
	return out
}

// leafPaths lists the dotted paths of values' leaves (a non-map, or an
// empty map).
func leafPaths(prefix string, v map[string]any, out *[]string) {
	for k, val := range v {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if m, ok := val.(map[string]any); ok && len(m) > 0 {
			leafPaths(p, m, out)
			continue
		}
		*out = append(*out, p)
	}
}

// TestValuesReferenceMatchesChart: every value of charts/poolpicker/values.yaml
// is described in the install page's values reference (itself or a parent
// described as a whole, as resources), and every key described exists.
func TestValuesReferenceMatchesChart(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "charts", "poolpicker", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, k := range tableColumn(section(t, installPage(t), "Values reference")) {
		documented[k] = true
	}
	var leaves []string
	leafPaths("", values, &leaves)
	sort.Strings(leaves)
	for _, leaf := range leaves {
		ok := false
		for p := leaf; p != ""; {
			if documented[p] {
				ok = true
				break
			}
			i := strings.LastIndex(p, ".")
			if i < 0 {
				break
			}
			p = p[:i]
		}
		if !ok {
			t.Errorf("value %s is not in the values reference of site-src/install.md", leaf)
		}
	}
	for k := range documented {
		var cur any = values
		for _, part := range strings.Split(k, ".") {
			m, _ := cur.(map[string]any)
			var ok bool
			if cur, ok = m[part]; !ok {
				t.Errorf("the values reference describes %s, which values.yaml does not have", k)
				break
			}
		}
	}
}

// TestRBACTableMatchesRules: the install page's RBAC table lists each rule of
// internal/permissions with its verbs, where and with which flag it is
// needed, and its reason.
func TestRBACTableMatchesRules(t *testing.T) {
	text := section(t, installPage(t), "RBAC")
	rows := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "| `") {
			rows++
		}
	}
	if rows != len(permissions.Rules) {
		t.Errorf("RBAC table has %d rows, internal/permissions.Rules %d", rows, len(permissions.Rules))
	}
	for _, r := range permissions.Rules {
		group := "`" + r.Group + "`"
		if r.Group == "" {
			group = "`\"\"` (core)"
		}
		where := "pools' namespaces"
		if r.Scope == permissions.OwnNamespace {
			where = "own namespace"
		}
		for i, f := range r.Features {
			if i == 0 {
				where += ", with `--" + f + "`"
			} else {
				where += " or `--" + f + "`"
			}
		}
		want := "| " + group + " | `" + r.Resource + "` | " + strings.Join(r.Verbs, ", ") + " | " + where + " | " + r.Why + " |"
		if !strings.Contains(text, want) {
			t.Errorf("RBAC table lacks the row\n%s", want)
		}
	}
}
