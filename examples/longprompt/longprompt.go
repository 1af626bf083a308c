// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package longprompt is an example scheduling plugin written outside
// poolpicker's module: a scorer that sends long prompts to the endpoints
// whose pods carry a label (servers started with a long context, say) and
// keeps short prompts off them. A binary adds its type, long-prompt-scorer,
// with app.WithPlugin(longprompt.Type, longprompt.New), so that a config
// file can name it.
package longprompt

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Type is the plugin type a config names.
const Type = "long-prompt-scorer"

// Defaults of Params.
const (
	DefaultMinPromptBytes = 8192
	DefaultLabel          = "poolpicker.example/long-context"
)

// Params are the scorer's parameters, as the config file gives them.
type Params struct {
	// MinPromptBytes is the prompt length from which a request counts as
	// long. The prompt is what the scheduler is handed (Request.Prompt):
	// the raw JSON of the chat messages or the completion prompt. Zero:
	// 8192.
	MinPromptBytes int `json:"minPromptBytes"`
	// Label names the pod label that marks a long-context endpoint; its
	// value must be "true". Empty: poolpicker.example/long-context.
	Label string `json:"label"`
}

// Scorer scores 1 the endpoints that suit the request's length: marked
// ones for a long prompt, unmarked ones for a short one. It sees each
// candidate through a read-only view (framework.Endpoint): labels, address,
// metrics and in-flight count to read, nothing to write.
type Scorer struct {
	name   framework.TypedName
	params Params
}

// The extension points it serves: a scorer that reads the prompt.
var (
	_ framework.Scorer       = (*Scorer)(nil)
	_ framework.PromptReader = (*Scorer)(nil)
)

// New is the plugin's factory: it builds an instance from the parameters
// of its config entry and names a bad one. This scorer needs nothing of
// the handle (a logger, a metrics registerer, the scheduler's context).
func New(name string, raw json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch {
	case p.MinPromptBytes < 0:
		return nil, fmt.Errorf("parameters: minPromptBytes %d must be at least 1 (or 0 for %d)", p.MinPromptBytes, DefaultMinPromptBytes)
	case p.MinPromptBytes == 0:
		p.MinPromptBytes = DefaultMinPromptBytes
	}
	if p.Label == "" {
		p.Label = DefaultLabel
	}
	return &Scorer{name: framework.TypedName{Type: Type, Name: name}, params: p}, nil
}

// TypedName implements framework.Plugin.
func (s *Scorer) TypedName() framework.TypedName { return s.name }

// PromptBytes implements framework.PromptReader: telling whether a prompt
// is long takes its first MinPromptBytes bytes. Without it the scorer
// would be handed no prompt at all.
func (s *Scorer) PromptBytes() int { return s.params.MinPromptBytes }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, req *framework.Request, candidates []framework.Candidate, scores []float64) *framework.Status {
	long := len(req.Prompt) >= s.params.MinPromptBytes
	for i, c := range candidates {
		if (c.Endpoint.Labels()[s.params.Label] == "true") == long {
			scores[i] = 1
		}
	}
	return nil
}
