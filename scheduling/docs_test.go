// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// documentedPluginTypes are the types in the first column of the tables of
// site-src/scheduling.md's "Plugins" section.
func documentedPluginTypes(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "site-src", "scheduling.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Plugins\n")
	if !ok {
		t.Fatal(`site-src/scheduling.md has no "## Plugins" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\|")
	var types []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		types = append(types, m[1])
	}
	slices.Sort(types)
	return types
}

// TestDocumentedPluginTypes keeps the plugin tables of the scheduling page
// equal to the types a config may name.
func TestDocumentedPluginTypes(t *testing.T) {
	documented := documentedPluginTypes(t)
	registered := pluginTypes(NewRegistry())
	for _, typ := range registered {
		if _, found := slices.BinarySearch(documented, typ); !found {
			t.Errorf("plugin type %s is registered but not in site-src/scheduling.md's Plugins tables", typ)
		}
	}
	for _, typ := range documented {
		if _, found := slices.BinarySearch(registered, typ); !found {
			t.Errorf("site-src/scheduling.md documents plugin type %s, which is not registered", typ)
		}
	}
	if len(slices.Compact(slices.Clone(documented))) != len(documented) {
		t.Errorf("a plugin type is documented twice: %v", documented)
	}
}
