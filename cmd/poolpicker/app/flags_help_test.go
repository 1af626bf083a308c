// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestHelpGrouped checks that --help prints its flags in the components'
// sections, in flagGroups' order, each flag once and no section empty.
func TestHelpGrouped(t *testing.T) {
	var o options
	var out bytes.Buffer
	fs := newFlagSet(&out, &o)
	if err := fs.Parse([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("--help: %v, want pflag.ErrHelp", err)
	}
	help := out.String()
	last := -1
	for _, g := range flagGroups {
		header := "\n" + strings.ToUpper(g[:1]) + g[1:] + " flags:\n"
		at := strings.Index(help, header)
		if at < 0 {
			t.Errorf("--help has no section %q (an empty section is not printed)", strings.TrimSpace(header))
			continue
		}
		if at < last {
			t.Errorf("section %q is out of flagGroups' order", g)
		}
		last = at
	}
	fs.VisitAll(func(f *pflag.Flag) {
		// A flag's own line starts with its name; others may name it in their text.
		line := regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(f.Name) + `[ \[]`)
		if n := len(line.FindAllStringIndex(help, -1)); n != 1 {
			t.Errorf("--%s appears %d times in --help, want once", f.Name, n)
		}
	})
}
