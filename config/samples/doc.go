// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package samples holds example objects; its test applies them to a real API
// server so they stay valid as the CRDs change.
package samples
