// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package rbac proves poolpicker's least-privilege RBAC: the built binary
// runs as the ServiceAccount of the rendered manifests, with a token from the
// TokenRequest API, against a real API server with RBAC on and the Inference
// Extension's published CRDs, through pools, objectives, rewrites, scraping
// and picks, without one forbidden answer; without any one permission it
// refuses to start and names it.
package rbac
