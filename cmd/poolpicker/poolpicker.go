// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command poolpicker is an Endpoint Picker for the Gateway API Inference
// Extension that serves many InferencePools from one process.
package main

import "github.com/poolpicker/poolpicker/cmd/poolpicker/app"

func main() { app.Main() }
