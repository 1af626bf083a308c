// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package image tests the image archive `make image` writes and the
// Dockerfile that builds the same image with Docker.
package image
