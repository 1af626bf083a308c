// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"slices"
	"testing"
)

// TestTokenizeAndRender checks that /tokenize and the render endpoints give
// the tokens the inference endpoints count, for completions and chats.
func TestTokenizeAndRender(t *testing.T) {
	s := startServer(t, Options{Model: "m", PromptBytesPerToken: 3, LoRAAdapters: []string{"ad"}})
	c := newClient(t)
	base := "http://" + s.Addr()
	type tokens struct {
		Tokens   []uint32 `json:"tokens"`
		TokenIDs []uint32 `json:"token_ids"`
		Count    int      `json:"count"`
	}
	type usage struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	completion := `{"model":"m","prompt":"the quick brown fox jumps"}`
	chat := `{"model":"ad","messages":[{"role":"user","content":"hello there"}]}`
	tests := []struct {
		name, path, body, infer string
		field                   func(tokens) []uint32
	}{
		{"tokenize a prompt", "/tokenize", completion, "/v1/completions", func(x tokens) []uint32 { return x.Tokens }},
		{"tokenize messages", "/tokenize", chat, "/v1/chat/completions", func(x tokens) []uint32 { return x.Tokens }},
		{"render a completion", "/v1/completions/render", completion, "/v1/completions", func(x tokens) []uint32 { return x.TokenIDs }},
		{"render a chat", "/v1/chat/completions/render", chat, "/v1/chat/completions", func(x tokens) []uint32 { return x.TokenIDs }},
	}
	var first []uint32
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, c, base+tt.path, tt.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s", tt.path, resp.StatusCode, b)
			}
			got := tt.field(decode[tokens](t, b))
			_, ib := post(t, c, base+tt.infer, tt.body)
			if n := decode[usage](t, ib).Usage.PromptTokens; n != len(got) || n == 0 {
				t.Errorf("%d tokens, the inference counted %d", len(got), n)
			}
			if tt.path == "/tokenize" && tt.infer == "/v1/completions" {
				first = got
			}
			if tt.path == "/v1/completions/render" && !slices.Equal(got, first) {
				t.Errorf("render %v, tokenize %v", got, first)
			}
		})
	}
	if resp, _ := post(t, c, base+"/tokenize", `{"model":"nope","prompt":"x"}`); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d, want 404", resp.StatusCode)
	}
}
