// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package tokenize turns a request's prompt into its model's token ids:
// by asking a model server's render endpoints (vLLM's and llm-d's
// simulator's /v1/completions/render and /v1/chat/completions/render), one
// round trip per prompt, bounded in time, the answers cached whole and by
// the prefixes prompts share (Renderer); or in process, from the model's
// tokenizer.json (Local).
package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Defaults of Options.
const (
	DefaultTimeout          = 50 * time.Millisecond
	DefaultCacheEntries     = 4096
	DefaultMaxResponseBytes = 8 << 20
	DefaultPrefixCacheBytes = 64 << 20
	DefaultMinPrefixShare   = 0.8
)

// Options configure a Renderer; zero values mean the documented defaults.
type Options struct {
	// Timeout bounds one round trip: a pick never waits longer for its
	// tokens. Zero: 50ms.
	Timeout time.Duration
	// CacheEntries is how many prompts' token ids are kept, so a prompt
	// seen again (a retry, a shared system prompt sent as the whole
	// prompt) costs no round trip. Zero: 4096.
	CacheEntries int
	// MaxResponseBytes bounds a render response. Zero: 8 MiB.
	MaxResponseBytes int64
	// PrefixCacheBytes bounds the memory of the prompts kept to learn the
	// prefixes they share, and of the learned prefixes' tokens (see
	// prefixStore). Zero: 64 MiB; negative: no prefix cache.
	PrefixCacheBytes int64
	// MinPrefixShare is the least share of a prompt's bytes a learned
	// prefix must cover for its tokens to stand for the prompt's, without
	// a round trip. Zero: 0.8.
	MinPrefixShare float64
	// Client sends the requests. Nil: a client of its own.
	Client *http.Client
	// Local are in-process tokenizers by model name: a completion's prompt
	// of one of these models is tokenized here, within Timeout, without a
	// round trip. (Chat messages need the model's chat template, which the
	// model server applies: they are still rendered.) Nil: none.
	Local map[string]*Local
	// LocalOnly makes no round trips: a prompt that no local tokenizer
	// reads is an error (ErrNoTokenizer).
	LocalOnly bool
}

// Renderer asks model servers for prompts' token ids. Safe for concurrent
// use.
type Renderer struct {
	opts     Options
	cache    *lru.Cache[uint64, []uint32]
	prefixes *prefixStore // nil: none
}

// Tokens are a prompt's token ids. Whole is false when they are the tokens
// of a leading part of the prompt only: a learned prefix the prompt starts
// with, the rest of it not tokenized.
type Tokens struct {
	IDs   []uint32
	Whole bool
}

// New returns a renderer.
func New(opts Options) (*Renderer, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.CacheEntries <= 0 {
		opts.CacheEntries = DefaultCacheEntries
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.PrefixCacheBytes == 0 {
		opts.PrefixCacheBytes = DefaultPrefixCacheBytes
	}
	if opts.MinPrefixShare <= 0 {
		opts.MinPrefixShare = DefaultMinPrefixShare
	}
	if opts.MinPrefixShare > 1 {
		return nil, fmt.Errorf("tokenize: the least prefix share %v is more than 1", opts.MinPrefixShare)
	}
	c, err := lru.New[uint64, []uint32](opts.CacheEntries)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	r := &Renderer{opts: opts, cache: c}
	if opts.PrefixCacheBytes > 0 {
		r.prefixes = newPrefixStore(opts.PrefixCacheBytes, opts.MinPrefixShare)
	}
	return r, nil
}

// ErrNoTokenizer is the error of a prompt that only a round trip could
// tokenize, when LocalOnly forbids it.
var ErrNoTokenizer = errors.New("tokenize: no local tokenizer reads this prompt")

// Kind is what a request's prompt is.
type Kind uint8

// The prompt kinds.
const (
	// Completion is a completion's prompt: a string or a list of strings.
	Completion Kind = iota + 1
	// Chat is a chat's messages.
	Chat
	// TokenIDs is a completion's prompt given as token ids.
	TokenIDs
)

// KindOf tells what the raw JSON prompt (the value of "prompt" or
// "messages") is; 0 when it is none of them.
func KindOf(raw []byte) Kind {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch raw[0] {
	case '"':
		return Completion
	case '[':
		rest := bytes.TrimSpace(raw[1:])
		switch {
		case len(rest) == 0:
			return 0
		case rest[0] == '{':
			return Chat
		case rest[0] == '"':
			return Completion
		case rest[0] >= '0' && rest[0] <= '9':
			return TokenIDs
		}
	}
	return 0
}

// Tokens returns the token ids of the raw JSON prompt of model, from the
// prompt itself when it is token ids, else from the cache, a learned prefix
// of the prompt (then not Whole), or the render endpoint of the server at
// baseURL (e.g. "http://10.0.0.1:8000"). The ids are shared: read them
// only.
func (r *Renderer) Tokens(ctx context.Context, baseURL, model string, raw []byte) (Tokens, error) {
	kind := KindOf(raw)
	if kind == 0 {
		return Tokens{}, errors.New("tokenize: the prompt is neither a string, a list of strings or token ids, nor chat messages")
	}
	if kind == TokenIDs {
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err != nil {
			return Tokens{}, fmt.Errorf("tokenize: token ids: %w", err)
		}
		return Tokens{IDs: ids, Whole: true}, nil
	}
	// The prefixes' hashes are the model's and the kind's own.
	seed := xxhash.Sum64String(model) + uint64(kind)
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.Write([]byte{0, byte(kind)})
	_, _ = d.Write(raw)
	key := d.Sum64()
	if ids, ok := r.cache.Get(key); ok {
		return Tokens{IDs: ids, Whole: true}, nil
	}
	if l := r.opts.Local[model]; l != nil && kind == Completion {
		ids, err := r.local(ctx, l, raw)
		if err != nil {
			return Tokens{}, err
		}
		r.cache.Add(key, ids)
		return Tokens{IDs: ids, Whole: true}, nil
	}
	if r.opts.LocalOnly {
		return Tokens{}, ErrNoTokenizer
	}
	var lv []uint64
	if r.prefixes != nil {
		lv = levels(seed, raw)
		if ids, ok := r.prefixes.lookup(seed, raw, lv); ok {
			return Tokens{IDs: ids}, nil
		}
	}
	ids, err := r.render(ctx, baseURL, model, kind, raw)
	if err != nil {
		return Tokens{}, err
	}
	r.cache.Add(key, ids)
	if r.prefixes != nil {
		r.prefixes.observe(seed, raw, lv, ids)
	}
	return Tokens{IDs: ids, Whole: true}, nil
}

// local tokenizes a completion's prompt (a string, or a list of strings of
// which the first, as parseRender reads a rendered list) with l, within
// Timeout.
func (r *Renderer) local(ctx context.Context, l *Local, raw []byte) ([]uint32, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
			return nil, errors.New("tokenize: the prompt is neither a string nor a list of strings")
		}
		text = list[0]
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	return l.EncodeContext(ctx, text)
}

// render asks the render endpoint of the server at baseURL.
func (r *Renderer) render(ctx context.Context, baseURL, model string, kind Kind, raw []byte) ([]uint32, error) {
	path, field := "/v1/completions/render", "prompt"
	if kind == Chat {
		path, field = "/v1/chat/completions/render", "messages"
	}
	m, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	body := make([]byte, 0, len(raw)+len(model)+32)
	body = append(body, `{"model":`...)
	body = append(body, m...)
	body = append(body, `,"`...)
	body = append(body, field...)
	body = append(body, `":`...)
	body = append(body, raw...)
	body = append(body, '}')
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.opts.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, r.opts.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize: %s answered %d: %.200s", path, resp.StatusCode, b)
	}
	if int64(len(b)) > r.opts.MaxResponseBytes {
		return nil, fmt.Errorf("tokenize: %s answered more than %d bytes", path, r.opts.MaxResponseBytes)
	}
	ids, err := parseRender(b)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	return ids, nil
}

// parseRender reads the token ids of a render answer: an object with
// "token_ids" (or /tokenize's "tokens"), or a list of such objects (vLLM
// renders a list of prompts), of which the first.
func parseRender(b []byte) ([]uint32, error) {
	type answer struct {
		TokenIDs []uint32 `json:"token_ids"`
		Tokens   []uint32 `json:"tokens"`
	}
	b = bytes.TrimSpace(b)
	var a answer
	if len(b) > 0 && b[0] == '[' {
		var list []answer
		if err := json.Unmarshal(b, &list); err != nil {
			return nil, err
		}
		if len(list) == 0 {
			return nil, errors.New("an empty list")
		}
		a = list[0]
	} else if err := json.Unmarshal(b, &a); err != nil {
		return nil, err
	}
	if a.TokenIDs != nil {
		return a.TokenIDs, nil
	}
	if a.Tokens != nil {
		return a.Tokens, nil
	}
	return nil, errors.New(`no "token_ids" in the answer`)
}
