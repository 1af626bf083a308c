// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// statsCollector exports per-pool scrape counters and the pool aggregates.
// The aggregates are computed when collected, from the endpoints' current
// snapshots, so they cost nothing between collections and vanish with
// their pool.
type statsCollector struct {
	m        *Manager
	errors   *prometheus.CounterVec
	scrapes  *prometheus.CounterVec
	costly   *prometheus.CounterVec
	kv       *prometheus.Desc
	queue    *prometheus.Desc
	running  *prometheus.Desc
	podQueue *prometheus.Desc

	budgetCores, budgetUsed, budgetWait, budgetPerScrape, budgetRate, budgetSlowed, budgetInterval *prometheus.Desc
}

func newStatsCollector(m *Manager) *statsCollector {
	pool := []string{"namespace", "name"}
	return &statsCollector{
		m: m,
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_pool_metrics_scrape_errors_total",
			Help: "Failed scrapes of the pool's model-server metrics, by reason (config, connect, timeout, status, body, too_large, parse, transport).",
		}, append(pool, "reason")),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_pool_metrics_scrapes_total",
			Help: "Scrapes of the pool's model-server metrics, failed or not.",
		}, pool),
		costly: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolpicker_scrape_costly_pages_total",
			Help: "Scrapes of the pool's model servers whose page cost more CPU than --metrics-scrape-max-server-cpu-share pays for at the server's interval, which was lengthened to fit it.",
		}, pool),
		kv: prometheus.NewDesc("inference_pool_average_kv_cache_utilization",
			"Average KV-cache utilization (0..1) of the pool's endpoints with fresh metrics; absent when none has.", pool, nil),
		queue: prometheus.NewDesc("inference_pool_average_queue_size",
			"Average number of queued requests of the pool's endpoints with fresh metrics; absent when none has.", pool, nil),
		running: prometheus.NewDesc("inference_pool_average_running_requests",
			"Average number of running requests of the pool's endpoints with fresh metrics; absent when none has.", pool, nil),
		podQueue: prometheus.NewDesc("inference_pool_per_pod_queue_size",
			"Queued requests of each of the pool's model servers with fresh metrics, named as upstream names them (POD-rank-I, I the target port's index).",
			append(pool, "model_server_pod"), nil),
		budgetCores: prometheus.NewDesc("poolpicker_scrape_budget_cores",
			"CPU the metrics scrapes may use (--metrics-scrape-cpu-budget), in cores; 0 when unlimited.", nil, nil),
		budgetUsed: prometheus.NewDesc("poolpicker_scrape_budget_used_cpu_seconds_total",
			"CPU time the metrics scrapes spent, each measured on its own thread.", nil, nil),
		budgetWait: prometheus.NewDesc("poolpicker_scrape_budget_wait_seconds_total",
			"Time a due metrics scrape waited for the CPU budget.", nil, nil),
		budgetPerScrape: prometheus.NewDesc("poolpicker_scrape_budget_cpu_per_scrape_seconds",
			"Average CPU time of a metrics scrape.", nil, nil),
		budgetRate: prometheus.NewDesc("poolpicker_scrape_budget_scrapes_per_second",
			"Metrics scrapes a second the CPU budget pays for at the average cost; 0 when unlimited.", nil, nil),
		budgetSlowed: prometheus.NewDesc("poolpicker_scrape_budget_slowed_pools",
			"Busy pools whose model servers the budget lets be scraped less often than --refresh-metrics-interval, sharing it by request rate.", nil, nil),
		budgetInterval: prometheus.NewDesc("poolpicker_scrape_budget_busy_interval_max_seconds",
			"The longest time between scrapes of a busy pool's model servers that the budget allows (--refresh-metrics-interval when it covers every busy server).", nil, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	c.errors.Describe(ch)
	c.scrapes.Describe(ch)
	c.costly.Describe(ch)
	ch <- c.kv
	ch <- c.queue
	ch <- c.running
	ch <- c.podQueue
	for _, d := range []*prometheus.Desc{c.budgetCores, c.budgetUsed, c.budgetWait, c.budgetPerScrape, c.budgetRate, c.budgetSlowed, c.budgetInterval} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.errors.Collect(ch)
	c.scrapes.Collect(ch)
	c.costly.Collect(ch)
	b := c.m.budget
	c.m.mu.Lock()
	slowed, longest := c.m.slowed, max(c.m.longest, c.m.opts.RefreshInterval)
	c.m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.budgetCores, prometheus.GaugeValue, b.cores)
	ch <- prometheus.MustNewConstMetric(c.budgetUsed, prometheus.CounterValue, time.Duration(b.used.Load()).Seconds())
	ch <- prometheus.MustNewConstMetric(c.budgetWait, prometheus.CounterValue, time.Duration(b.waited.Load()).Seconds())
	ch <- prometheus.MustNewConstMetric(c.budgetPerScrape, prometheus.GaugeValue, b.expected().Seconds())
	ch <- prometheus.MustNewConstMetric(c.budgetRate, prometheus.GaugeValue, b.rate())
	ch <- prometheus.MustNewConstMetric(c.budgetSlowed, prometheus.GaugeValue, float64(slowed))
	ch <- prometheus.MustNewConstMetric(c.budgetInterval, prometheus.GaugeValue, longest.Seconds())
	now := time.Now()
	for _, p := range c.m.scrapedPools() {
		a, ok := aggregate(p, now, c.m.opts.StalenessThreshold)
		if !ok {
			continue
		}
		ns, name := p.Key.Namespace, p.Key.Name
		ch <- prometheus.MustNewConstMetric(c.kv, prometheus.GaugeValue, a.kv, ns, name)
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, a.queue, ns, name)
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, a.running, ns, name)
		ports := p.Spec().TargetPorts
		for _, e := range p.Endpoints().Endpoints {
			if m := e.Metrics(); m.Fresh(now, c.m.opts.StalenessThreshold) {
				ch <- prometheus.MustNewConstMetric(c.podQueue, prometheus.GaugeValue, float64(m.WaitingRequests), ns, name, modelServerPod(e, ports))
			}
		}
	}
}

// modelServerPod names an endpoint as upstream's per-pod metrics do: the
// pod's name and the index of its target port in the pool's spec.
func modelServerPod(e *datastore.Endpoint, targetPorts []int32) string {
	rank := slices.Index(targetPorts, e.Port)
	return e.Pod.Name + "-rank-" + strconv.Itoa(max(rank, 0))
}

func (c *statsCollector) forgetPool(key datastore.PoolKey) {
	l := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	c.errors.DeletePartialMatch(l)
	c.scrapes.DeletePartialMatch(l)
	c.costly.DeletePartialMatch(l)
}

type poolAggregate struct{ kv, queue, running float64 }

// aggregate averages the pool's fresh endpoints; false when none is fresh,
// because an average over unknown loads is unknown, not zero.
func aggregate(p *datastore.Pool, now time.Time, staleness time.Duration) (poolAggregate, bool) {
	var a poolAggregate
	n := 0
	for _, e := range p.Endpoints().Endpoints {
		m := e.Metrics()
		if !m.Fresh(now, staleness) {
			continue
		}
		n++
		a.kv += m.KVCacheUsage
		a.queue += float64(m.WaitingRequests)
		a.running += float64(m.RunningRequests)
	}
	if n == 0 {
		return a, false
	}
	a.kv /= float64(n)
	a.queue /= float64(n)
	a.running /= float64(n)
	return a, true
}
