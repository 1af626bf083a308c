// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"strconv"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// PluginStatus is what a filter or a scorer said of a request when it was
// not a plain success (framework.Status): why a filter dropped candidates,
// or why a scorer could not score. Results, decisions and log lines carry
// them.
type PluginStatus struct {
	// Plugin is the plugin instance, as Decision.Scorers names scorers.
	Plugin string `json:"plugin"`
	// ExtensionPoint is where it ran: Filter or Scorer.
	ExtensionPoint string `json:"extensionPoint"`
	// Code is the status code: Unschedulable or Failed.
	Code string `json:"code"`
	// Reasons are the plugin's reasons.
	Reasons []string `json:"reasons,omitempty"`
	// Dropped is how many candidates a filter dropped.
	Dropped int `json:"dropped,omitempty"`
}

func (p PluginStatus) String() string {
	s := p.ExtensionPoint + " " + p.Plugin + ": " + p.Code
	for i, r := range p.Reasons {
		if i == 0 {
			s += ": " + r
		} else {
			s += "; " + r
		}
	}
	if p.Dropped > 0 {
		s += " (dropped " + strconv.Itoa(p.Dropped) + ")"
	}
	return s
}

// pluginStatus is a PluginStatus as a cycle keeps it, without building
// strings on the pick path.
type pluginStatus struct {
	plugin  framework.TypedName
	point   string
	status  *framework.Status
	dropped int
}

func (p *pluginStatus) export() PluginStatus {
	return PluginStatus{Plugin: p.plugin.String(), ExtensionPoint: p.point, Code: p.status.Code().String(),
		Reasons: p.status.Reasons(), Dropped: p.dropped}
}

// reasonsOf is ": " and the status's message, or "" when it has none: the
// tail of an error message.
func reasonsOf(st *framework.Status) string {
	if m := st.Message(); m != "" {
		return ": " + m
	}
	return ""
}
