// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package examples checks that the examples under this directory, each a Go
// module of its own as an out-of-tree plugin would be, build and pass their
// tests against this tree.
package examples
