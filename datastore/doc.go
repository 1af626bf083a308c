// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package datastore holds what poolpicker knows of the pools it serves: a
// registry from pool key to Pool, each Pool's immutable endpoint snapshot
// (pods × target ports) and, per endpoint, the latest model-server metrics and
// the count of requests in flight.
//
// Readers on the request path never block writers and never take a global
// lock: the registry, each pool's spec and endpoint set, and each endpoint's
// metrics are immutable values behind atomic pointers, replaced whole by
// writers (controllers, scrapers) that serialise among themselves.
package datastore
