// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/scheduling"
)

// approximateConfig is preciseConfig's profile with the approximate
// prefix-cache scorer in the precise one's place.
const approximateConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// BenchmarkPickPrecise is the time and CPU of one pick (scheduling and its post-pick
// step, no ext_proc) of a 40-block prompt whose prefix the servers hold, with
// the precise scorer (its tokens cached, or rendered by a server each time:
// a new suffix), with and without speculative indexing, against the
// approximate one, on the same pool.
func BenchmarkPickPrecise(b *testing.B) {
	for _, bc := range []struct {
		name, config string
		newSuffix    bool
	}{
		{"approximate", approximateConfig, false},
		{"precise tokens cached", unspeculativeConfig, false},
		{"precise rendered", unspeculativeConfig, true},
		{"precise speculative tokens cached", speculativeConfig, false},
		{"precise speculative rendered", speculativeConfig, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pp := newPrecisePool(b, []string{"127.0.92.2", "127.0.92.3", "127.0.92.4"}, bc.config)
			if strings.Contains(bc.config, "precise") {
				pp.followed(b)
			}
			for p := range 3 {
				pp.send(completionBody(fmt.Sprintf("prefix %d round 0", p), 40))
			}
			body := completionBody("prefix 1 round 1", 40)
			ctx := context.Background()
			b.ReportAllocs()
			cpu := processCPUTime()
			n := 0
			for i := 0; b.Loop(); i++ {
				n++
				req := &scheduling.Request{Model: "m", Prompt: promptOf(body)}
				if bc.newSuffix {
					req.Prompt = promptOf(completionBody(fmt.Sprintf("prefix 1 round %d", i+2), 40))
				}
				res, err := pp.sched.ScheduleDeferred(ctx, pp.pool, req)
				if err != nil {
					b.Fatal(err)
				}
				res.Commit()
			}
			// The process's CPU: the pick's, and in the rendered case the
			// in-process server's render too.
			b.ReportMetric(float64(processCPUTime()-cpu)/float64(n), "cpu-ns/op")
		})
	}
}

// promptOf is a completion body's raw "prompt" value, as the picker reads it.
func promptOf(body []byte) []byte {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(body, &m)
	return m["prompt"]
}
