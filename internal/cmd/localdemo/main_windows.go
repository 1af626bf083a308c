// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command localdemo runs poolpicker's local stack on Linux and macOS only:
// it starts etcd and kube-apiserver through envtest, which does not build
// for Windows.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "localdemo (make run) runs on Linux and macOS: it starts etcd and kube-apiserver, which envtest cannot run on Windows")
	os.Exit(2)
}
