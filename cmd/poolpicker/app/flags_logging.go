// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	goflag "flag"
	"io"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// defaultVerbosity is the upstream EPP's default -v: steady-state lines
// (V(2)) are logged, debug (4) and trace (5) are not.
const defaultVerbosity = 2

// loggingOptions are the logging flags, named and defaulted as the upstream
// EPP's (controller-runtime's zap flags and -v), so its Deployments' log
// arguments keep their meaning.
type loggingOptions struct {
	verbosity int
	zap       zap.Options
	// klogFlags holds klog's own flags: --vmodule is offered, and -v is
	// copied into it so client-go's klog lines follow the same verbosity.
	klogFlags *goflag.FlagSet
}

func bindLoggingFlags(fs *pflag.FlagSet, o *loggingOptions) {
	// Development mode as upstream: console lines unless --zap-encoder=json.
	o.zap.Development = true
	fs.IntVarP(&o.verbosity, "v", "v", defaultVerbosity,
		"Log verbosity: 0 important, 2 steady state, 4 debug, 5 trace. Ignored when --zap-log-level is set.")
	zfs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	o.zap.BindFlags(zfs)
	fs.AddGoFlagSet(zfs)
	o.klogFlags = goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(o.klogFlags)
	fs.AddGoFlag(o.klogFlags.Lookup("vmodule"))
}

// newLogger builds the process logger writing to w. -v sets the level unless
// --zap-log-level was given (as upstream). klog (client-go, controller-runtime
// internals) is routed through the same logger and verbosity.
func newLogger(fs *pflag.FlagSet, o *loggingOptions, w io.Writer) logr.Logger {
	zo := o.zap
	zo.DestWriter = w
	if f := fs.Lookup("zap-log-level"); f == nil || !f.Changed {
		zo.Level = zapcore.Level(-int8(min(max(o.verbosity, 0), 127)))
	}
	log := zap.New(zap.UseFlagOptions(&zo))
	if v := o.klogFlags.Lookup("v"); v != nil {
		_ = v.Value.Set(strconv.Itoa(max(o.verbosity, 0)))
	}
	klog.SetLogger(log)
	return log
}
