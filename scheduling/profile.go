package scheduling

import (
	"fmt"
	"time"
)

// profile is a built scheduling profile: what runs, in order.
type profile struct {
	name    string
	filters []Filter
	scorers []weightedScorer
	picker  Picker
	// pickerMax caps the endpoints of a result (the picker's
	// maxNumOfEndpoints); 0: Options.MaxEndpoints.
	pickerMax   int
	postPickers []PostPicker
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
	Scorer
	weight float64
}

// builtConfig is a config's plugin instances and profiles.
type builtConfig struct {
	profiles       map[string]*profile
	defaultProfile string
	// plugins are every instance, declared and added, in a stable order.
	plugins []Plugin
}

// buildProfiles instantiates the config's plugins and assembles its profiles.
// Every profile gets a subset filter first (the gateway's subset hint is a
// protocol rule, not a choice) unless it already has one, then, when
// Options.EnableConformanceTestFilter is set, the conformance-test filter;
// a profile without a picker gets a max-score picker.
func buildProfiles(cfg *Config, opts Options) (*builtConfig, error) {
	b := &builtConfig{profiles: make(map[string]*profile, len(cfg.SchedulingProfiles)), defaultProfile: cfg.defaultProfile()}
	instances := make(map[string]Plugin, len(cfg.Plugins))
	for _, spec := range cfg.Plugins {
		factory, ok := builtins[spec.Type]
		if !ok {
			return nil, fmt.Errorf("plugin %q: unknown type %q", spec.Name, spec.Type)
		}
		p, err := factory(spec.Name, spec.Parameters)
		if err != nil {
			return nil, fmt.Errorf("plugin %q (type %s): %w", spec.Name, spec.Type, err)
		}
		instances[spec.Name] = p
		b.plugins = append(b.plugins, p)
	}
	var implicitSubset, implicitConformance Plugin
	for _, ps := range cfg.SchedulingProfiles {
		prof := &profile{name: ps.Name}
		hasSubset, hasConformance := false, false
		for _, ref := range ps.Plugins {
			p := instances[ref.PluginRef]
			if p == nil {
				return nil, fmt.Errorf("profile %q: pluginRef %q names no declared plugin", ps.Name, ref.PluginRef)
			}
			used := false
			if f, ok := p.(Filter); ok {
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
			if s, ok := p.(Scorer); ok {
				w := 1.0
				if ref.Weight != nil {
					w = *ref.Weight
				}
				prof.scorers = append(prof.scorers, weightedScorer{Scorer: s, weight: w})
				used = true
			} else if ref.Weight != nil {
				return nil, fmt.Errorf("profile %q: plugin %q (type %s) is not a scorer, so it takes no weight", ps.Name, ref.PluginRef, p.TypedName().Type)
			}
			if pk, ok := p.(Picker); ok {
				if prof.picker != nil {
					return nil, fmt.Errorf("profile %q: two pickers, %q and %q; a profile has one", ps.Name, prof.picker.TypedName().Name, ref.PluginRef)
				}
				prof.picker = pk
				if m, ok := p.(maxEndpointser); ok {
					prof.pickerMax = m.MaxEndpoints()
				}
				used = true
			}
			if pp, ok := p.(PostPicker); ok {
				prof.postPickers = append(prof.postPickers, pp)
			}
			if !used {
				return nil, fmt.Errorf("profile %q: plugin %q (type %s) is not a filter, scorer or picker", ps.Name, ref.PluginRef, p.TypedName().Type)
			}
		}
		var front []Filter
		if !hasSubset {
			if implicitSubset == nil {
				implicitSubset, _ = newSubsetFilter(SubsetFilterType, nil)
				b.plugins = append(b.plugins, implicitSubset)
			}
			front = append(front, implicitSubset.(Filter))
		}
		if opts.EnableConformanceTestFilter && !hasConformance {
			if implicitConformance == nil {
				implicitConformance, _ = newConformanceTestFilter(ConformanceTestFilterType, nil)
				b.plugins = append(b.plugins, implicitConformance)
			}
			front = append(front, implicitConformance.(Filter))
		}
		prof.filters = append(front, prof.filters...)
		if prof.picker == nil {
			p, _ := newMaxScorePicker(MaxScorePickerType, nil)
			prof.picker = p.(Picker)
			b.plugins = append(b.plugins, p)
		}
		prof.timePlugins(opts.PluginDuration)
		b.profiles[ps.Name] = prof
	}
	return b, nil
}
