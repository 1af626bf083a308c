// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"

	"github.com/poolpicker/poolpicker/internal/tracing"
	"github.com/poolpicker/poolpicker/internal/version"
)

// tracingShutdownTimeout bounds the flush of buffered spans at exit.
const tracingShutdownTimeout = 5 * time.Second

// startTracing sets up the span exporter when --tracing is on and the
// OTEL_* environment names an exporter, and gives the ext_proc server its
// tracer. The returned stop flushes buffered spans; it is never nil.
func startTracing(ctx context.Context, o *options, log logr.Logger) (stop func(), err error) {
	if !o.observability.tracing {
		return func() {}, nil
	}
	p, warnings, err := tracing.New(ctx, tracing.Config{Version: version.Get().Version})
	for _, w := range warnings {
		log.Info("WARNING: tracing: "+w, "warning", true)
	}
	if err != nil || p == nil {
		return func() {}, err
	}
	tlog := log.WithName("tracing")
	// Export failures (collector down) are logged, not fatal.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { tlog.V(2).Info("trace export failed", "err", err.Error()) }))
	o.extproc.Tracer = p.Tracer
	log.Info("tracing on", "exporter", p.Exporter, "sampler", p.Sampler)
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			tlog.Info("flushing spans at exit failed", "err", err.Error())
		}
	}, nil
}
