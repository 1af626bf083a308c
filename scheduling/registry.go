// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"encoding/json"
	"sort"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/filter"
	"github.com/poolpicker/poolpicker/scheduling/plugins/load"
	"github.com/poolpicker/poolpicker/scheduling/plugins/lora"
	"github.com/poolpicker/poolpicker/scheduling/plugins/picker"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// The types a scheduler's caller sees; plugins find them, and the
// extension points, in package framework.
type (
	// Request is what the scheduler picks for (framework.Request).
	Request = framework.Request
	// Error is a pick that failed, with the status to answer
	// (framework.Error).
	Error = framework.Error
	// TypedName names a plugin by its type and name (framework.TypedName).
	TypedName = framework.TypedName
)

// Sentinels of the scheduler's errors, for errors.Is.
var (
	ErrNoEndpoints = framework.ErrNoEndpoints
	ErrShed        = framework.ErrShed
)

// NewNoEndpointsError returns the 503 error for a pool with no eligible
// endpoint (errors.Is ErrNoEndpoints).
func NewNoEndpointsError(format string, args ...any) *Error {
	return framework.NewNoEndpointsError(format, args...)
}

// NewShedError returns the 429 error for a sheddable request refused under
// saturation (errors.Is ErrShed).
func NewShedError(format string, args ...any) *Error {
	return framework.NewShedError(format, args...)
}

// Built-in plugin type names. Where the reference EPP has a plugin of the
// same purpose, the name is the reference's, so its configs read the same
// here. site-src/scheduling.md lists them (a test keeps the list equal to
// NewRegistry's types).
const (
	SubsetFilterType             = filter.SubsetType
	ConformanceTestFilterType    = filter.ConformanceTestType
	QueueScorerType              = load.QueueType
	KVCacheUtilizationScorerType = load.KVCacheUtilizationType
	RunningRequestsScorerType    = load.RunningRequestsType
	InFlightScorerType           = load.InFlightType
	LoRAAffinityScorerType       = lora.AffinityType
	PrefixCacheScorerType        = prefix.Type
	PrecisePrefixCacheScorerType = prefix.PreciseType
	MaxScorePickerType           = picker.MaxScoreType
	RandomPickerType             = picker.RandomType
	WeightedRandomPickerType     = picker.WeightedRandomType
	RoundRobinPickerType         = picker.RoundRobinType
	SingleProfileHandlerType     = "single-profile-handler"
)

// builtinRegistry resolves the plugin types of configs when no registry is
// given (LoadConfig, and New without Options.Registry): the built-in
// plugins only. Nothing registers into it.
var builtinRegistry = NewRegistry()

// NewRegistry returns a registry of the built-in plugins (and the upstream
// types accepted as inert): the one place they are registered. A program
// adds its own plugins to it (poolpicker's command: app.WithPlugin) and
// hands it to New in Options.Registry.
func NewRegistry() *framework.Registry {
	r := framework.NewRegistry()
	for t, f := range map[string]framework.Factory{
		SubsetFilterType:             filter.NewSubset,
		ConformanceTestFilterType:    filter.NewConformanceTest,
		QueueScorerType:              load.NewQueue,
		KVCacheUtilizationScorerType: load.NewKVCacheUtilization,
		RunningRequestsScorerType:    load.NewRunningRequests,
		InFlightScorerType:           load.NewInFlight,
		LoRAAffinityScorerType:       lora.NewAffinity,
		PrefixCacheScorerType:        prefix.New,
		PrecisePrefixCacheScorerType: prefix.NewPrecise,
		MaxScorePickerType:           picker.NewMaxScore,
		RandomPickerType:             picker.NewRandom,
		WeightedRandomPickerType:     picker.NewWeightedRandom,
		RoundRobinPickerType:         picker.NewRoundRobin,
		SingleProfileHandlerType:     newSingleProfileHandler,
	} {
		mustRegister(r, t, f)
	}
	for t := range inertPluginTypes {
		mustRegister(r, t, func(name string, _ json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
			return &inertPlugin{name: TypedName{Type: t, Name: name}}, nil
		})
	}
	return r
}

func mustRegister(r *framework.Registry, typeName string, f framework.Factory) {
	if err := r.Register(typeName, f); err != nil {
		panic("scheduling: " + err.Error())
	}
}

func pluginTypes(r *framework.Registry) []string {
	types := r.Types()
	for t := range pluginTypeAliases {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// singleProfileHandler is accepted so configs written for the reference EPP
// load unchanged; poolpicker chooses the profile per pool (by annotation),
// so the handler has nothing to do.
type singleProfileHandler struct{ name TypedName }

func newSingleProfileHandler(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &singleProfileHandler{name: TypedName{Type: SingleProfileHandlerType, Name: name}}, nil
}

func (p *singleProfileHandler) TypedName() TypedName { return p.name }
