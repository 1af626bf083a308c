package extproc

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names follow the upstream Inference Extension's request metrics,
// with a pool label added because one process serves many pools.
const otherLabel = "other"

type metrics struct {
	requests     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	inputTokens  *prometheus.HistogramVec
	outputTokens *prometheus.HistogramVec
	models       *labelCap
}

func newMetrics(reg prometheus.Registerer, maxModels int) (*metrics, error) {
	labels := []string{"model_name", "target_model_name", "pool"}
	tokenBuckets := prometheus.ExponentialBuckets(1, 4, 12) // 1 .. ~4M tokens
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total",
			Help: "Requests the endpoint picker routed, by model, target model and pool.",
		}, labels),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total",
			Help: "Requests answered with an error by the endpoint picker, by HTTP status code.",
		}, append(labels, "error_code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_duration_seconds",
			Help:    "Time from request headers to the end of the response, as seen by the endpoint picker.",
			Buckets: []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600},
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
		models: &labelCap{max: maxModels, seen: map[string]struct{}{}},
	}
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.duration, m.inputTokens, m.outputTokens} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// labelCap admits the first max distinct values and maps the rest to
// "other": model names come from clients, so they must not grow series
// without bound. Pool labels are bounded by the served pools.
type labelCap struct {
	mu   sync.RWMutex
	max  int
	seen map[string]struct{}
}

func (c *labelCap) value(v string) string {
	if v == "" {
		return v
	}
	c.mu.RLock()
	_, ok := c.seen[v]
	n := len(c.seen)
	c.mu.RUnlock()
	if ok {
		return v
	}
	if n >= c.max {
		return otherLabel
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		return otherLabel
	}
	c.seen[v] = struct{}{}
	return v
}

// requestLabels are one request's metric labels, computed once.
type requestLabels struct{ model, target, pool string }

func (m *metrics) labels(model, target, pool string) requestLabels {
	return requestLabels{model: m.models.value(model), target: m.models.value(target), pool: pool}
}

func (m *metrics) routed(l requestLabels) {
	m.requests.WithLabelValues(l.model, l.target, l.pool).Inc()
}

func (m *metrics) failed(l requestLabels, code int) {
	m.errors.WithLabelValues(l.model, l.target, l.pool, strconv.Itoa(code)).Inc()
}

func (m *metrics) completed(l requestLabels, d time.Duration, u Usage, hasUsage bool) {
	m.duration.WithLabelValues(l.model, l.target, l.pool).Observe(d.Seconds())
	if hasUsage {
		m.inputTokens.WithLabelValues(l.model, l.target, l.pool).Observe(float64(u.PromptTokens))
		m.outputTokens.WithLabelValues(l.model, l.target, l.pool).Observe(float64(u.CompletionTokens))
	}
}
