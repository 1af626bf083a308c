// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command withplugin is poolpicker with a scheduling plugin written as one
// outside poolpicker's module is: it imports the framework only, so the
// endpoints it scores are views with getters and nothing else (no
// SetMetrics, no AddInFlight: that it cannot reach a writer holds by
// construction). It publishes what its views say as metrics registered
// through its factory's handle, for TestWithPlugin to read.
package main

import (
	"context"
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/cmd/poolpicker/app"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

const viewRecorderType = "view-recorder"

type viewRecorder struct {
	// waiting is the waiting requests the scored endpoints' views report.
	waiting *prometheus.GaugeVec
	// picks counts the picks PostPick heard of, by primary endpoint.
	picks *prometheus.CounterVec
}

func newViewRecorder(_ string, _ json.RawMessage, h framework.Handle) (framework.Plugin, error) {
	r := &viewRecorder{
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_view_recorder_waiting", Help: "Waiting requests of the endpoint, as the plugin's view reports them."}, []string{"endpoint"}),
		picks:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_view_recorder_picks_total", Help: "Picks the plugin heard of."}, []string{"primary"}),
	}
	for _, c := range []prometheus.Collector{r.waiting, r.picks} {
		if err := h.MetricsRegisterer().Register(c); err != nil {
			return nil, err
		}
	}
	h.Logger().Info("view-recorder built")
	return r, nil
}

func (r *viewRecorder) TypedName() framework.TypedName {
	return framework.TypedName{Type: viewRecorderType, Name: viewRecorderType}
}

func (r *viewRecorder) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		scores[i] = 1
		if m := c[i].Endpoint.Metrics(); !m.IsZero() {
			r.waiting.WithLabelValues(c[i].Endpoint.Address()).Set(float64(m.WaitingRequests()))
		}
	}
	return nil
}

func (r *viewRecorder) PostPick(_ context.Context, _ *framework.CycleState, _ *framework.Request, res *framework.Result) {
	r.picks.WithLabelValues(res.Endpoints[0].Address()).Inc()
}

func main() {
	app.NewCommand(app.WithPlugin(viewRecorderType, newViewRecorder)).Main()
}
