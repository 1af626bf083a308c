// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"
)

// The metric name families poolpicker can export (--metric-names).
const (
	// metricNamesInference are the Inference Extension's names
	// (inference_objective_*, inference_pool_*, inference_extension_*),
	// deprecated in the llm-d router.
	metricNamesInference = "inference"
	// metricNamesLLMD are the llm-d router's current names (llm_d_epp_*).
	metricNamesLLMD = "llm-d"
)

// llmdName is the llm-d router's name of one of poolpicker's metric
// families, and the labels it spells differently.
type llmdName struct {
	name   string
	labels map[string]string
}

// llmdNames maps every request, scheduler and pool family that the llm-d
// router exports under an llm_d_epp_* name to that name. Buckets, values
// and the other labels are the same; the router's pool and request families
// have no namespace label, poolpicker's do (one picker serves many
// namespaces). Families poolpicker alone has (poolpicker_*, the scrape
// counters) keep their one name.
var llmdNames = map[string]llmdName{
	"inference_objective_request_total":                            {name: "llm_d_epp_request_total"},
	"inference_objective_request_error_total":                      {name: "llm_d_epp_request_error_total"},
	"inference_objective_request_duration_seconds":                 {name: "llm_d_epp_request_duration_seconds"},
	"inference_objective_request_sizes":                            {name: "llm_d_epp_request_size_bytes"},
	"inference_objective_response_sizes":                           {name: "llm_d_epp_response_size_bytes"},
	"inference_objective_input_tokens":                             {name: "llm_d_epp_request_input_tokens"},
	"inference_objective_output_tokens":                            {name: "llm_d_epp_request_output_tokens"},
	"inference_objective_prompt_cached_tokens":                     {name: "llm_d_epp_request_cached_tokens"},
	"inference_objective_running_requests":                         {name: "llm_d_epp_request_running"},
	"inference_objective_normalized_time_per_output_token_seconds": {name: "llm_d_epp_request_ntpot_seconds"},
	"inference_objective_request_ttft_seconds":                     {name: "llm_d_epp_request_ttft_seconds"},
	"inference_objective_request_tpot_seconds":                     {name: "llm_d_epp_request_streaming_tpot_seconds"},
	"inference_pool_average_kv_cache_utilization":                  {name: "llm_d_epp_average_kv_cache_utilization"},
	"inference_pool_average_queue_size":                            {name: "llm_d_epp_average_queue_size"},
	"inference_pool_average_running_requests":                      {name: "llm_d_epp_average_running_requests"},
	"inference_pool_ready_pods":                                    {name: "llm_d_epp_ready_endpoints"},
	"inference_pool_per_pod_queue_size":                            {name: "llm_d_epp_per_endpoint_queue_size", labels: map[string]string{"model_server_pod": "model_server_endpoint"}},
	"inference_extension_scheduler_e2e_duration_seconds":           {name: "llm_d_epp_scheduler_e2e_duration_seconds"},
	"inference_extension_scheduler_attempts_total":                 {name: "llm_d_epp_scheduler_attempts_total", labels: map[string]string{"pod_name": "endpoint_name"}},
	"inference_extension_plugin_duration_seconds":                  {name: "llm_d_epp_plugin_duration_seconds"},
	"inference_extension_model_rewrite_decisions_total":            {name: "llm_d_epp_model_rewrite_decisions_total"},
	"inference_extension_info":                                     {name: "llm_d_epp_info"},
}

// metricNames are the name families --metric-names selects; at least one.
type metricNames struct{ inference, llmd bool }

func (m *metricNames) String() string {
	var out []string
	if m.inference {
		out = append(out, metricNamesInference)
	}
	if m.llmd {
		out = append(out, metricNamesLLMD)
	}
	return strings.Join(out, ",")
}

func (m *metricNames) Set(v string) error {
	var next metricNames
	for _, s := range strings.Split(v, ",") {
		switch strings.TrimSpace(s) {
		case metricNamesInference:
			next.inference = true
		case metricNamesLLMD:
			next.llmd = true
		case "":
		default:
			return fmt.Errorf("unknown metric name family %q: want %s, %s or both", s, metricNamesInference, metricNamesLLMD)
		}
	}
	if !next.inference && !next.llmd {
		return fmt.Errorf("empty: name at least one of %s and %s", metricNamesInference, metricNamesLLMD)
	}
	*m = next
	return nil
}

func (m *metricNames) Type() string { return "strings" }

func bindMetricNamesFlag(fs *pflag.FlagSet, m *metricNames) {
	*m = metricNames{inference: true, llmd: true}
	fs.Var(m, "metric-names", fmt.Sprintf("Names under which the request, scheduler and pool metrics are exported, comma-separated: %s (inference_objective_*, inference_pool_*, inference_extension_*, the Inference Extension's) and %s (llm_d_epp_*, the llm-d router's current names); the same series under both, labels as each project spells them.",
		metricNamesInference, metricNamesLLMD))
}

// renamingGatherer re-exports each family of llmdNames under its llm-d
// name (with names.llmd) and keeps or drops its own name (names.inference).
// Renaming at gather time keeps one set of collectors, so the two names
// can never disagree.
type renamingGatherer struct {
	g     prometheus.Gatherer
	names metricNames
}

func (r renamingGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := r.g.Gather()
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		to, ok := llmdNames[mf.GetName()]
		if !ok {
			out = append(out, mf)
			continue
		}
		if r.names.inference {
			out = append(out, mf)
		}
		if r.names.llmd {
			out = append(out, renamed(mf, to))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, err
}

// renamed is a copy of mf under to's name and labels, label pairs sorted by
// name as the exposition format expects.
func renamed(mf *dto.MetricFamily, to llmdName) *dto.MetricFamily {
	c := proto.Clone(mf).(*dto.MetricFamily)
	c.Name = proto.String(to.name)
	if len(to.labels) == 0 {
		return c
	}
	for _, m := range c.Metric {
		for _, lp := range m.Label {
			if n, ok := to.labels[lp.GetName()]; ok {
				lp.Name = proto.String(n)
			}
		}
		slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
	return c
}
