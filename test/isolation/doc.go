// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package isolation proves that one tenant of a shared poolpicker cannot
// hurt another: two tenants in two namespaces on a real API server, the
// built binary as two replicas with peer sync (as the chart deploys it),
// simulated model servers on loopback IPs and the development gateway.
// Tenant A misbehaves in each way the suite knows while tenant B's steady
// traffic runs; tenant B must see every request served, fresh metrics and
// the process's memory within the chart's limit. The full mode
// (-isolation.full) measures each case as alternating pairs of short
// windows with and without the misbehaviour and holds the median of the
// paired ratios of tenant B's pick and metric-age p99 to 1.2x
// (paired_test.go says why).
package isolation
