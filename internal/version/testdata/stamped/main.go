// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command stamped prints the build identity; version_test builds it with
// -ldflags -X as `make image` builds poolpicker.
package main

import (
	"fmt"

	"github.com/poolpicker/poolpicker/internal/version"
)

func main() {
	i := version.Get()
	fmt.Print(i.Version, " ", i.Commit)
}
