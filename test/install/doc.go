// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package install tests what a platform team installs: the image archive of
// `make image`, the kustomize tree of config/deploy and the Helm chart of
// charts/poolpicker, rendered, linted and dry-run on a real API server.
package install
