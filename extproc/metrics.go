// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// Metric names follow the upstream Inference Extension's request metrics,
// with namespace and pool labels added because one process serves many
// pools.
const otherLabel = "other"

// sizeBuckets are upstream's request and response size buckets, in bytes:
// powers of 2 from 64 B to 1 GiB, then 2 and 4 GiB.
var sizeBuckets = append(prometheus.ExponentialBuckets(64, 2, 25), 2<<30, 4<<30)

// latencyBuckets are upstream's request latency buckets, 5 ms to 1 hour.
var latencyBuckets = []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}

type metrics struct {
	requests     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	inputTokens  *prometheus.HistogramVec
	outputTokens *prometheus.HistogramVec
	cachedTokens *prometheus.HistogramVec
	// Upstream's other request metrics, same names and buckets.
	requestSizes  *prometheus.HistogramVec
	responseSizes *prometheus.HistogramVec
	running       *prometheus.GaugeVec
	normTPOT      *prometheus.HistogramVec
	ttft          *prometheus.HistogramVec
	tpot          *prometheus.HistogramVec
	schedulerE2E  *prometheus.HistogramVec
	attempts      *prometheus.CounterVec
	rewrites      *prometheus.CounterVec
	models        *labelCap

	// mu orders series writes (read side) against the deletion of a
	// removed pool's or endpoint's series (write side), so that none is
	// written again after it was deleted.
	mu  sync.RWMutex
	reg *datastore.Registry
	// byPool are the vectors with namespace and pool labels.
	byPool []prometheus.Collector
}

func newMetrics(reg prometheus.Registerer, pools *datastore.Registry, maxModels, reservePercent int) (*metrics, error) {
	labels := []string{"model_name", "target_model_name", "namespace", "pool"}
	tokenBuckets := prometheus.ExponentialBuckets(1, 4, 12) // 1 .. ~4M tokens
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total",
			Help: "Requests the endpoint picker routed, by model, target model, priority (of the request's InferenceObjective) and pool.",
		}, []string{"model_name", "target_model_name", "priority", "namespace", "pool"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total",
			Help: "Requests answered with an error by the endpoint picker, by error code as upstream spells it (BadRequest, NotFound, ResourceExhausted, ServiceUnavailable, ...).",
		}, append(labels, "error_code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_duration_seconds",
			Help:    "Time from request headers to the end of the response, as seen by the endpoint picker.",
			Buckets: latencyBuckets,
		}, labels),
		inputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_input_tokens",
			Help:    "Prompt tokens per request, from the model server's usage report.",
			Buckets: tokenBuckets,
		}, labels),
		outputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_output_tokens",
			Help:    "Completion tokens per request, from the model server's usage report.",
			Buckets: tokenBuckets,
		}, labels),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_prompt_cached_tokens",
			Help:    "Prompt tokens per request served from the model server's prefix cache (usage.prompt_tokens_details.cached_tokens), when the model server reports them.",
			Buckets: []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576}, // upstream's
		}, labels),
		requestSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_sizes",
			Help:    "Request body bytes, by model, target model and pool.",
			Buckets: sizeBuckets,
		}, labels),
		responseSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_response_sizes",
			Help:    "Response body bytes, by model, target model and pool.",
			Buckets: sizeBuckets,
		}, labels),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_objective_running_requests",
			Help: "Requests routed and not yet finished, by model and pool.",
		}, []string{"model_name", "namespace", "pool"}),
		normTPOT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_normalized_time_per_output_token_seconds",
			Help:    "Request duration divided by its output tokens, from the model server's usage report.",
			Buckets: []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0},
		}, labels),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_ttft_seconds",
			Help:    "Time from request headers to the first body byte of a streamed (text/event-stream) response, as seen by the endpoint picker.",
			Buckets: latencyBuckets,
		}, labels),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_tpot_seconds",
			Help:    "Time per output token after the first of a streamed response: (duration - TTFT) / (completion tokens - 1), from the model server's usage report.",
			Buckets: []float64{0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360},
		}, labels),
		schedulerE2E: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_extension_scheduler_e2e_duration_seconds",
			Help:    "Time the scheduler took to pick for one request, by pool.",
			Buckets: []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1},
		}, []string{"namespace", "pool"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_scheduler_attempts_total",
			Help: "Scheduling attempts by status (success, failure), target model, the picked endpoint's pod and port (empty on failure), and the pool's namespace and name.",
		}, []string{"status", "target_model_name", "pod_name", "namespace", "port", "pool"}),
		rewrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_model_rewrite_decisions_total",
			Help: "Requests whose model an InferenceModelRewrite rewrote, by rewrite, requested model, target model and pool.",
		}, []string{"model_rewrite_name", "model_name", "target_model", "namespace", "pool"}),
		reg: pools,
	}
	m.models = newLabelCap(maxModels, reservePercent, m.modelTakenBack)
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.duration, m.inputTokens, m.outputTokens, m.cachedTokens,
		m.requestSizes, m.responseSizes, m.running, m.normTPOT, m.ttft, m.tpot, m.schedulerE2E, m.attempts, m.rewrites} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
		m.byPool = append(m.byPool, c)
	}
	if err := reg.Register(m.models); err != nil {
		return nil, err
	}
	return m, nil
}

// requestLabels are one request's metric labels, computed once: the
// models, and the pool's namespace and name (empty before the stream's pool
// is known).
type requestLabels struct {
	model, target, namespace, pool string
	// modelAdmission and targetAdmission are the models' admissions by
	// the label cap (labelCap.current): once a name is taken back, its
	// series are deleted and no more are written for it.
	modelAdmission, targetAdmission uint64
	// p is the stream's pool, nil before it is known: once it has left the
	// registry its series are deleted and no more are written.
	p *datastore.Pool
}

func (m *metrics) labels(model, target string, pool *datastore.Pool) requestLabels {
	var key datastore.PoolKey
	var pol *datastore.Policy
	if pool != nil {
		key, pol = pool.Key, pool.Policy()
	}
	ml, tl := m.models.value(key.Namespace, model, pol), m.models.value(key.Namespace, target, pol)
	return requestLabels{model: ml.value, target: tl.value, namespace: key.Namespace, pool: key.Name, p: pool,
		modelAdmission: ml.admission, targetAdmission: tl.admission}
}

// write takes the read side of m.mu for a write of l's series and reports
// whether to write them: not once l's pool has been removed or one of its
// model names taken back, as their series are gone (PoolRemoved and
// modelTakenBack hold the write side, so a write that saw them current is
// done before they go). The caller calls m.mu.RUnlock.
func (m *metrics) write(l requestLabels) bool {
	m.mu.RLock()
	return (l.p == nil || !l.p.Removed()) &&
		m.models.current(l.namespace, label{l.model, l.modelAdmission}) && m.models.current(l.namespace, label{l.target, l.targetAdmission})
}

// modelTakenBack deletes the series of a model name the label cap took
// back from namespace ns.
func (m *metrics) modelTakenBack(ns, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.byPool {
		for _, l := range []string{"model_name", "target_model_name", "target_model"} {
			c.(partialDeleter).DeletePartialMatch(prometheus.Labels{"namespace": ns, l: name})
		}
	}
}

func (m *metrics) routed(l requestLabels, priority, bodyBytes int) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	m.requests.WithLabelValues(l.model, l.target, strconv.Itoa(priority), l.namespace, l.pool).Inc()
	m.requestSizes.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(float64(bodyBytes))
	m.running.WithLabelValues(l.model, l.namespace, l.pool).Inc()
}

// ended undoes routed's running count, once per routed request.
func (m *metrics) ended(l requestLabels) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	m.running.WithLabelValues(l.model, l.namespace, l.pool).Dec()
}

// rewritten counts a model rewrite; rewrite names are bounded by the
// InferenceModelRewrite objects, models by the label cap.
func (m *metrics) rewritten(rewrite string, l requestLabels) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	m.rewrites.WithLabelValues(rewrite, l.model, l.target, l.namespace, l.pool).Inc()
}

func (m *metrics) scheduled(pool *datastore.Pool, d time.Duration) {
	defer m.mu.RUnlock()
	if !m.write(requestLabels{p: pool}) {
		return
	}
	m.schedulerE2E.WithLabelValues(pool.Key.Namespace, pool.Key.Name).Observe(d.Seconds())
}

// attempted counts one scheduling attempt for target: a success names the
// endpoint picked first, a failure (picked nil) leaves the endpoint empty.
// Pods are bounded by the served pools, models by the label cap.
func (m *metrics) attempted(l requestLabels, picked *datastore.Endpoint) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	if picked == nil {
		m.attempts.WithLabelValues("failure", l.target, "", l.namespace, "", l.pool).Inc()
		return
	}
	if cur, ok := l.p.Endpoints().Get(picked.Address); !ok || cur.Pod != picked.Pod {
		return // the endpoint has left the pool, and its series with it
	}
	m.attempts.WithLabelValues("success", l.target, picked.Pod.Name, picked.Pod.Namespace, strconv.Itoa(int(picked.Port)), l.pool).Inc()
}

func (m *metrics) failed(l requestLabels, code int) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	m.errors.WithLabelValues(l.model, l.target, l.namespace, l.pool, errorCode(code)).Inc()
}

// errorCode spells an answered HTTP status as the upstream EPP's error_code
// label does; a status upstream never answers keeps its number.
func errorCode(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "BadRequest"
	case http.StatusUnauthorized:
		return "Unauthorized"
	case http.StatusForbidden:
		return "Forbidden"
	case http.StatusNotFound:
		return "NotFound"
	case http.StatusTooManyRequests:
		return "ResourceExhausted"
	case http.StatusInternalServerError:
		return "Internal"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	}
	return strconv.Itoa(status)
}

// completed records a finished response; ttft is the time to its first
// body byte when the response was streamed, else zero.
func (m *metrics) completed(l requestLabels, d, ttft time.Duration, responseBytes int, u Usage, hasUsage bool) {
	defer m.mu.RUnlock()
	if !m.write(l) {
		return
	}
	m.duration.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(d.Seconds())
	if ttft > 0 {
		m.ttft.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(ttft.Seconds())
		if hasUsage && u.CompletionTokens > 1 {
			m.tpot.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe((d - ttft).Seconds() / float64(u.CompletionTokens-1))
		}
	}
	m.responseSizes.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(float64(responseBytes))
	if hasUsage {
		m.inputTokens.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(float64(u.PromptTokens))
		m.outputTokens.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(float64(u.CompletionTokens))
		if u.HasCachedTokens {
			m.cachedTokens.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(float64(u.CachedTokens))
		}
		if u.CompletionTokens > 0 {
			m.normTPOT.WithLabelValues(l.model, l.target, l.namespace, l.pool).Observe(d.Seconds() / float64(u.CompletionTokens))
		}
	}
}

// partialDeleter is every metric vector: DeletePartialMatch drops the
// series whose labels include the given ones.
type partialDeleter interface {
	DeletePartialMatch(prometheus.Labels) int
}

// PoolRemoved deletes the series of a pool that left the registry
// (datastore.Observer), failed attempts' included (their namespace label
// is the pool's, as a picked endpoint's is), and its namespace's model
// names once its last pool is gone.
func (m *metrics) PoolRemoved(pool *datastore.Pool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	byPool := prometheus.Labels{"namespace": pool.Key.Namespace, "pool": pool.Key.Name}
	for _, c := range m.byPool {
		c.(partialDeleter).DeletePartialMatch(byPool)
	}
	for _, p := range m.reg.Pools() {
		if p.Key.Namespace == pool.Key.Namespace {
			return
		}
	}
	m.models.forget(pool.Key.Namespace)
}

// EndpointsChanged deletes the attempt series of endpoints that left a
// pool (datastore.Observer); a pod that stays at a new address or under a
// new UID keeps its series, which name it by pod name and port.
func (m *metrics) EndpointsChanged(pool *datastore.Pool, _, removed []*datastore.Endpoint) {
	if len(removed) == 0 {
		return
	}
	type podPort struct {
		pod  string
		port int32
	}
	current := map[podPort]struct{}{}
	for _, e := range pool.Endpoints().Endpoints {
		current[podPort{e.Pod.Name, e.Port}] = struct{}{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range removed {
		if _, stays := current[podPort{e.Pod.Name, e.Port}]; stays {
			continue
		}
		m.attempts.DeletePartialMatch(prometheus.Labels{"pod_name": e.Pod.Name, "namespace": e.Pod.Namespace, "port": strconv.Itoa(int(e.Port)), "pool": pool.Key.Name})
	}
}
