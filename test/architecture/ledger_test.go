// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package architecture_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadWriters are the datastore methods that change an endpoint's load,
// and the one package (besides datastore, whose ledger calls them) that may
// call each in production code: a request's count only through a Lease, a
// held request only through a Hold, the peers' count only by peer sync.
var loadWriters = map[string]string{
	"AddInFlight":     "",
	"AddHeld":         "",
	"SetPeerInFlight": "peersync",
}

// TestLoadLedgerHasNoOtherWriter keeps the load ledger (datastore/ledger.go)
// the one owner of per-endpoint load: no production file outside datastore
// calls a load writer, peer sync's own count aside. Tests may, to set up a
// load.
func TestLoadLedgerHasNoOtherWriter(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	calls := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// Other modules (bench, examples, tools) and testdata are not
			// the product.
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "site") {
				return filepath.SkipDir
			}
			if rel != "." && fileExists(filepath.Join(path, "go.mod")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		if pkg == "datastore" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			allowed, writer := loadWriters[sel.Sel.Name]
			if !writer {
				return true
			}
			calls++
			if allowed == "" || pkg != allowed {
				t.Errorf("%s: calls %s: an endpoint's load changes only through the ledger (datastore.Lease, datastore.Hold)", fset.Position(call.Pos()), sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 {
		t.Fatal("found no call of a load writer at all (peer sync sets its count): is the walk reading the product's files?")
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
