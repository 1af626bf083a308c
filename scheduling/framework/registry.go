// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Factory builds a plugin instance named name from the parameters of its
// config entry (the YAML converted to JSON; nil when the entry has none),
// with h for what it needs of the scheduler it joins, as kube-scheduler's
// PluginFactory. A bad parameter is an error that names it; the caller
// adds the plugin's name and type. Factories run when a config is loaded
// (to check it, with a handle whose registerer is thrown away) and again
// for each scheduler built from it, so they keep nothing in package
// variables.
type Factory func(name string, params json.RawMessage, h Handle) (Plugin, error)

// Handle is what a factory gets of the scheduler it builds a plugin for.
type Handle interface {
	// Context is done when the scheduler's owner stops: a plugin that starts
	// a goroutine ends it then.
	Context() context.Context
	// Logger is the scheduler's logger, named for the plugin instance.
	Logger() logr.Logger
	// MetricsRegisterer registers the plugin's metrics where the process
	// serves its own. One scheduler builds each instance once; a config
	// with two instances of a type registers the type's metrics twice, so
	// label them by instance name or share them (AlreadyRegisteredError).
	MetricsRegisterer() prometheus.Registerer
}

// NewHandle returns a Handle of ctx, logger and registerer, as a scheduler
// builds for its plugins and as a plugin's tests call its factory. A nil
// ctx is context.Background(); a nil registerer is a registry of its own.
func NewHandle(ctx context.Context, logger logr.Logger, registerer prometheus.Registerer) Handle {
	if ctx == nil {
		ctx = context.Background()
	}
	if registerer == nil {
		registerer = prometheus.NewRegistry()
	}
	return &handle{ctx: ctx, log: logger, reg: registerer}
}

type handle struct {
	ctx context.Context
	log logr.Logger
	reg prometheus.Registerer
}

func (h *handle) Context() context.Context                 { return h.ctx }
func (h *handle) Logger() logr.Logger                      { return h.log }
func (h *handle) MetricsRegisterer() prometheus.Registerer { return h.reg }

// Registry maps plugin type names, as a config's plugins[].type gives
// them, to factories. It is safe for concurrent use; a program fills it
// before it reads a config (poolpicker's command: app.WithPlugin).
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: make(map[string]Factory)}
}

// Register makes typeName build with f. An empty name, a nil factory and a
// name already registered are errors: two plugins claiming one type would
// make a config mean whichever registered last.
func (r *Registry) Register(typeName string, f Factory) error {
	if typeName == "" {
		return errors.New("plugin registry: empty type name")
	}
	if f == nil {
		return fmt.Errorf("plugin registry: type %q: nil factory", typeName)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[typeName]; dup {
		return fmt.Errorf("plugin registry: type %q is already registered", typeName)
	}
	r.factories[typeName] = f
	return nil
}

// Factory returns the factory of typeName.
func (r *Registry) Factory(typeName string) (Factory, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.factories[typeName]
	return f, ok
}

// Types lists the registered type names, sorted.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	types := make([]string, 0, len(r.factories))
	for t := range r.factories {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// DecodeParams decodes a factory's params strictly into v: an unknown or
// mistyped parameter is an error that names it. Empty or null params leave
// v as it is.
func DecodeParams(params json.RawMessage, v any) error {
	trimmed := bytes.TrimSpace(params)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("parameters: trailing data")
	}
	return nil
}

// NoParams is the factory check of plugins that take no parameters: any
// given is an error naming them.
func NoParams(params json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := DecodeParams(params, &m); err != nil {
		return err
	}
	if len(m) > 0 {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return fmt.Errorf("parameters: takes none, got %q", keys)
	}
	return nil
}
