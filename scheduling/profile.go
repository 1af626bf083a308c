// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"fmt"
	"time"

	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/plugins/filter"
	"github.com/poolpicker/poolpicker/scheduling/plugins/picker"
)

// profile is a built scheduling profile: what runs, in order.
type profile struct {
	name    string
	filters []framework.Filter
	scorers []weightedScorer
	picker  framework.Picker
	// pickerMax caps the endpoints of a result (the picker's
	// maxNumOfEndpoints); 0: Options.MaxEndpoints.
	pickerMax   int
	postPickers []framework.PostPicker
	timers      pluginTimers
}

// pluginTimers record each plugin call's duration (Options.PluginDuration),
// by position in the profile's filters and scorers; nil: not timed.
type pluginTimers struct {
	filters, scorers, picker []func(time.Duration)
}

func (t *pluginTimers) start() time.Time {
	if t.picker == nil {
		return time.Time{}
	}
	return time.Now()
}

func (t *pluginTimers) observe(fs []func(time.Duration), i int, start time.Time) {
	if fs != nil {
		fs[i](time.Since(start))
	}
}

// timePlugins resolves every plugin's duration recorder once.
func (p *profile) timePlugins(newTimer func(extensionPoint string, plugin TypedName) func(time.Duration)) {
	if newTimer == nil {
		return
	}
	for _, f := range p.filters {
		p.timers.filters = append(p.timers.filters, newTimer(FilterExtensionPoint, f.TypedName()))
	}
	for _, s := range p.scorers {
		p.timers.scorers = append(p.timers.scorers, newTimer(ScorerExtensionPoint, s.TypedName()))
	}
	p.timers.picker = []func(time.Duration){newTimer(PickerExtensionPoint, p.picker.TypedName())}
}

type weightedScorer struct {
	framework.Scorer
	weight float64
}

// builtConfig is a config's plugin instances and profiles.
type builtConfig struct {
	profiles       map[string]*profile
	defaultProfile string
	// plugins are every instance, declared and added, in a stable order.
	plugins []framework.Plugin
}

// buildProfiles instantiates the config's plugins and assembles its profiles.
// Every profile gets a subset filter first (the gateway's subset hint is a
// protocol rule, not a choice) unless it already has one, then, when
// Options.EnableConformanceTestFilter is set, the conformance-test filter;
// a profile without a picker gets a max-score picker.
func buildProfiles(cfg *Config, opts Options) (*builtConfig, error) {
	b := &builtConfig{profiles: make(map[string]*profile, len(cfg.SchedulingProfiles)), defaultProfile: cfg.defaultProfile()}
	instances := make(map[string]framework.Plugin, len(cfg.Plugins))
	for _, spec := range cfg.Plugins {
		factory, ok := opts.registry().Factory(spec.Type)
		if !ok {
			return nil, fmt.Errorf("plugin %q: unknown type %q", spec.Name, spec.Type)
		}
		p, err := factory(spec.Name, spec.Parameters, opts.handle(spec.Type, spec.Name))
		if err != nil {
			return nil, fmt.Errorf("plugin %q (type %s): %w", spec.Name, spec.Type, err)
		}
		if p == nil {
			return nil, fmt.Errorf("plugin %q (type %s): the factory returned no plugin", spec.Name, spec.Type)
		}
		instances[spec.Name] = p
		b.plugins = append(b.plugins, p)
	}
	var implicitSubset, implicitConformance framework.Plugin
	for _, ps := range cfg.SchedulingProfiles {
		prof := &profile{name: ps.Name}
		hasSubset, hasConformance := false, false
		for _, ref := range ps.Plugins {
			p := instances[ref.PluginRef]
			if p == nil {
				return nil, fmt.Errorf("profile %q: pluginRef %q names no declared plugin", ps.Name, ref.PluginRef)
			}
			used := false
			if f, ok := p.(framework.Filter); ok {
				prof.filters = append(prof.filters, f)
				used = true
				switch p.TypedName().Type {
				case SubsetFilterType:
					hasSubset = true
				case ConformanceTestFilterType:
					hasConformance = true
					if !opts.EnableConformanceTestFilter {
						return nil, fmt.Errorf("profile %q: plugin %q (type %s) works only with the conformance-test option enabled; it lets a client choose its endpoint", ps.Name, ref.PluginRef, ConformanceTestFilterType)
					}
				}
			}
			if s, ok := p.(framework.Scorer); ok {
				w := 1.0
				if ref.Weight != nil {
					w = *ref.Weight
				}
				prof.scorers = append(prof.scorers, weightedScorer{Scorer: s, weight: w})
				used = true
			} else if ref.Weight != nil {
				return nil, fmt.Errorf("profile %q: plugin %q (type %s) is not a scorer, so it takes no weight", ps.Name, ref.PluginRef, p.TypedName().Type)
			}
			if pk, ok := p.(framework.Picker); ok {
				if prof.picker != nil {
					return nil, fmt.Errorf("profile %q: two pickers, %q and %q; a profile has one", ps.Name, prof.picker.TypedName().Name, ref.PluginRef)
				}
				prof.picker = pk
				if m, ok := p.(framework.EndpointLimiter); ok {
					prof.pickerMax = m.MaxEndpoints()
				}
				used = true
			}
			if pp, ok := p.(framework.PostPicker); ok {
				prof.postPickers = append(prof.postPickers, pp)
				used = true
			}
			if !used {
				return nil, fmt.Errorf("profile %q: plugin %q (type %s) is not a filter, scorer or picker (nor a post-picker)", ps.Name, ref.PluginRef, p.TypedName().Type)
			}
		}
		var front []framework.Filter
		if !hasSubset {
			if implicitSubset == nil {
				implicitSubset, _ = filter.NewSubset(SubsetFilterType, nil, opts.handle(SubsetFilterType, SubsetFilterType))
				b.plugins = append(b.plugins, implicitSubset)
			}
			front = append(front, implicitSubset.(framework.Filter))
		}
		if opts.EnableConformanceTestFilter && !hasConformance {
			if implicitConformance == nil {
				implicitConformance, _ = filter.NewConformanceTest(ConformanceTestFilterType, nil, opts.handle(ConformanceTestFilterType, ConformanceTestFilterType))
				b.plugins = append(b.plugins, implicitConformance)
			}
			front = append(front, implicitConformance.(framework.Filter))
		}
		prof.filters = append(front, prof.filters...)
		if prof.picker == nil {
			p, _ := picker.NewMaxScore(MaxScorePickerType, nil, opts.handle(MaxScorePickerType, MaxScorePickerType))
			prof.picker = p.(framework.Picker)
			b.plugins = append(b.plugins, p)
		}
		prof.timePlugins(opts.PluginDuration)
		b.profiles[ps.Name] = prof
	}
	return b, nil
}
