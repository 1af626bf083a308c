// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package framework is poolpicker's public scheduling plugin API: the
// extension points a plugin implements, the per-cycle state plugins share,
// the request and result they see, and the registry that maps a config's
// plugin type names to factories.
//
// A plugin is built by a Factory from its instance name and the raw
// parameters of its config entry, and serves every extension point whose
// interface it implements: Filter, Scorer, Picker (with EndpointLimiter),
// PostPicker, and PromptReader when it reads the prompt. The scheduler
// (package scheduling) runs them per request; package
// scheduling/plugins/... holds the built-in ones, and site-src/plugins.md
// shows a scorer written and registered outside this module.
package framework
