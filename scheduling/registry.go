package scheduling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
)

// Plugin type names. Where the reference EPP has a plugin of the same
// purpose, the name is the reference's, so its configs read the same here.
const (
	SubsetFilterType             = "subset-filter"
	ConformanceTestFilterType    = "header-based-testing-filter"
	QueueScorerType              = "queue-scorer"
	KVCacheUtilizationScorerType = "kv-cache-utilization-scorer"
	RunningRequestsScorerType    = "running-requests-size-scorer"
	InFlightScorerType           = "in-flight-scorer"
	LoRAAffinityScorerType       = "lora-affinity-scorer"
	PrefixCacheScorerType        = "prefix-cache-scorer"
	MaxScorePickerType           = "max-score-picker"
	RandomPickerType             = "random-picker"
	WeightedRandomPickerType     = "weighted-random-picker"
	RoundRobinPickerType         = "round-robin-picker"
	SingleProfileHandlerType     = "single-profile-handler"
)

// factory builds a plugin instance named name from its YAML parameters
// (converted to JSON; nil when the config gives none). It returns an error
// naming the bad parameter; the caller adds the plugin's name and type.
type factory func(name string, params json.RawMessage) (Plugin, error)

// builtins maps plugin types to their factories. Read-only after init.
var builtins = map[string]factory{
	SubsetFilterType:             newSubsetFilter,
	ConformanceTestFilterType:    newConformanceTestFilter,
	QueueScorerType:              newQueueScorer,
	KVCacheUtilizationScorerType: newKVCacheScorer,
	RunningRequestsScorerType:    newRunningRequestsScorer,
	InFlightScorerType:           newInFlightScorer,
	LoRAAffinityScorerType:       newLoRAAffinityScorer,
	PrefixCacheScorerType:        newPrefixCacheScorer,
	MaxScorePickerType:           newMaxScorePicker,
	RandomPickerType:             newRandomPicker,
	WeightedRandomPickerType:     newWeightedRandomPicker,
	RoundRobinPickerType:         newRoundRobinPicker,
	SingleProfileHandlerType:     newSingleProfileHandler,
}

// PluginTypes lists the plugin types a config may name, sorted.
func PluginTypes() []string {
	types := make([]string, 0, len(builtins)+len(pluginTypeAliases))
	for t := range builtins {
		types = append(types, t)
	}
	for t := range pluginTypeAliases {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// decodeParams decodes params strictly into v: an unknown or mistyped
// parameter is an error that names it.
func decodeParams(params json.RawMessage, v any) error {
	if len(bytes.TrimSpace(params)) == 0 || bytes.Equal(bytes.TrimSpace(params), []byte("null")) {
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

// noParams is the factory check for plugins that take no parameters.
func noParams(params json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := decodeParams(params, &m); err != nil {
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

// singleProfileHandler is accepted so configs written for the reference EPP
// load unchanged; poolpicker chooses the profile per pool (by annotation),
// so the handler has nothing to do.
type singleProfileHandler struct{ name TypedName }

func newSingleProfileHandler(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &singleProfileHandler{name: TypedName{Type: SingleProfileHandlerType, Name: name}}, nil
}

func (p *singleProfileHandler) TypedName() TypedName { return p.name }
