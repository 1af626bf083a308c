// Package scrape keeps every endpoint's model-server metrics fresh: one
// scraper goroutine per endpoint reads the server's Prometheus /metrics page,
// parses only the families the picker uses, and publishes a timestamped
// datastore.Metrics snapshot.
//
// A failed scrape never publishes: the last good snapshot stays and goes
// stale by its ScrapedAt, so the scheduler treats the endpoint as unknown
// rather than idle. Scrapers start when an endpoint appears in a pool and are
// stopped, and waited for, before the registry's change notification returns.
package scrape
