// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestConfigurationReferenceListsEveryFlag keeps site-src/configuration.md
// true: a flag added or renamed without updating the reference fails here.
func TestConfigurationReferenceListsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "site-src", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	var o options
	newFlagSet(io.Discard, &o).VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(string(doc), "--"+f.Name+" ") && !strings.Contains(string(doc), "--"+f.Name+"[") && !strings.Contains(string(doc), "--"+f.Name+"\n") {
			t.Errorf("flag --%s is not in site-src/configuration.md: regenerate its flag list from `poolpicker --help`", f.Name)
		}
	})
}
