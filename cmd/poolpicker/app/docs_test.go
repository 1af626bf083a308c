// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestConfigurationReferenceIsTheHelp keeps site-src/configuration.md true:
// its flag list is `poolpicker --help` as printed, sections and all, so a
// flag added, renamed, moved or redescribed without updating the reference
// fails here. UPDATE_DOCS=1 rewrites the list from --help.
func TestConfigurationReferenceIsTheHelp(t *testing.T) {
	path := filepath.Join("..", "..", "..", "site-src", "configuration.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var o options
	var help bytes.Buffer
	if err := newFlagSet(&help, &o).Parse([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	const open, end = "```text\n", "\n```\n"
	start := bytes.Index(doc, []byte(open))
	if start < 0 {
		t.Fatalf("%s has no ```text block for the flags", path)
	}
	start += len(open)
	stop := bytes.Index(doc[start:], []byte(end))
	if stop < 0 {
		t.Fatalf("%s: the flags' ```text block is not closed", path)
	}
	stop += start
	want := strings.TrimRight(help.String(), "\n")
	if got := string(doc[start:stop]); got != want {
		if os.Getenv("UPDATE_DOCS") != "" {
			updated := append(append(append([]byte{}, doc[:start]...), want...), doc[stop:]...)
			if err := os.WriteFile(path, updated, 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("the flag list of %s is not what --help prints: rerun with UPDATE_DOCS=1 to rewrite it from --help", path)
	}
}
