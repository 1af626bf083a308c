// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package requestbody reads what an OpenAI-style request body says to the
// picker (its model, the start of its prompt, its stream flag) in one pass
// while the body arrives, and rewrites its model.
package requestbody

// Kind says what a request path's body holds for the picker.
type Kind int

const (
	// Unknown is a path the picker has no schema for: the model is read
	// when the body is JSON and carries one; nothing is required.
	Unknown Kind = iota
	// NoPath is a request without a path (NGINX Gateway Fabric's shim sends
	// no pseudo-headers); its body is taken to be an OpenAI request, chat
	// or completion.
	NoPath
	// Completions is /v1/completions: the prompt is the "prompt" value.
	Completions
	// Chat is /v1/chat/completions: the prompt is the "messages" array.
	Chat
	// ModelOnly is /v1/responses or /v1/embeddings: only the model matters.
	ModelOnly
)

// KindOf classifies a request's :path (query and trailing slashes ignored).
func KindOf(path string) Kind {
	if path == "" {
		return NoPath
	}
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			path = path[:i]
			break
		}
	}
	for len(path) > 1 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	switch path {
	case "/v1/completions":
		return Completions
	case "/v1/chat/completions":
		return Chat
	case "/v1/responses", "/v1/embeddings":
		return ModelOnly
	}
	return Unknown
}

// Strict reports whether a body on this path must be a JSON object with a
// non-empty string model; on other paths a body the reader cannot read
// gives an empty Request, not an error.
func (k Kind) Strict() bool { return k != Unknown }

// HoldsPrompt reports whether the top-level member key is the prompt on
// this path: "prompt" for Completions, "messages" for Chat, either for
// NoPath.
func (k Kind) HoldsPrompt(key string) bool {
	switch key {
	case "prompt":
		return k == Completions || k == NoPath
	case "messages":
		return k == Chat || k == NoPath
	}
	return false
}

// hasPrompt reports whether the picker reads a prompt for this path.
func (k Kind) hasPrompt() bool { return k == Completions || k == Chat || k == NoPath }

// reads reports whether the picker reads the top-level member key on this
// path (the others are skimmed once the prompt is full).
func (k Kind) reads(key string) bool { return key == "model" || key == "stream" || k.HoldsPrompt(key) }

func (k Kind) String() string {
	switch k {
	case NoPath:
		return "no path"
	case Completions:
		return "completions"
	case Chat:
		return "chat"
	case ModelOnly:
		return "model only"
	}
	return "unknown"
}
