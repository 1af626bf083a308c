// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package image

import (
	"fmt"
	"os"
	"testing"

	"github.com/poolpicker/poolpicker/internal/testenv"
)

var root string

func TestMain(m *testing.M) {
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
