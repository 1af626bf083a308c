// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package scrape keeps every endpoint's model-server metrics fresh: one
// scheduler scrapes each model server's Prometheus /metrics page once per
// interval, however many pools hold it, parses only the families the picker
// uses, and publishes a timestamped datastore.Metrics snapshot to each
// pool's endpoint.
//
// A failed scrape never publishes: the last good snapshot stays and goes
// stale by its ScrapedAt, so the scheduler treats the endpoint as unknown
// rather than idle. A server is scraped from when an endpoint resolving to
// it appears in a pool; when the last one leaves, its scrape in flight is
// cancelled and waited for before the registry's change notification
// returns.
package scrape
