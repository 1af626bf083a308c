// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package docs keeps the documentation site (site-src) true to itself: every
// link between its pages, and every anchor a link names, leads somewhere.
package docs
