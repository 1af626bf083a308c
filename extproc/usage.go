// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"bytes"
	"encoding/json"
)

// Usage is the token accounting a model server reports in its response.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: the prompt
	// tokens the server served from its prefix cache. vLLM reports it when
	// prefix caching (and prompt-token details) are on; HasCachedTokens
	// tells a reported 0 from a server that does not report it.
	CachedTokens    int
	HasCachedTokens bool
}

// UnmarshalJSON reads the OpenAI usage object, including the nested
// prompt_tokens_details.cached_tokens (null or absent details leave
// HasCachedTokens false).
func (u *Usage) UnmarshalJSON(b []byte) error {
	var w struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		Details          *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*u = Usage{PromptTokens: w.PromptTokens, CompletionTokens: w.CompletionTokens}
	if w.Details != nil && w.Details.CachedTokens != nil {
		u.CachedTokens, u.HasCachedTokens = *w.Details.CachedTokens, true
	}
	return nil
}

const (
	// maxJSONResponseHold is how much of a non-streamed response is kept for
	// a full parse; beyond it only the tail is kept, where servers put usage.
	maxJSONResponseHold = 256 << 10
	// responseTailBytes is the tail kept of a large non-streamed response.
	responseTailBytes = 16 << 10
	// maxSSELineBytes bounds one SSE line held while it is incomplete; longer
	// lines are skipped (they are token deltas, not the usage event).
	maxSSELineBytes = 1 << 20
)

// usageReader follows a response body chunk by chunk and keeps only what it
// needs to find usage: a bounded JSON buffer or tail, or the current SSE line.
type usageReader struct {
	sse bool

	buf       []byte // JSON: the body so far (or its tail); SSE: the partial line
	truncated bool   // JSON: buf holds only a tail
	skipLine  bool   // SSE: the current line overflowed and is being skipped

	usage    Usage
	hasUsage bool
	done     bool // SSE: [DONE] seen
}

func (u *usageReader) write(chunk []byte) {
	if u.sse {
		u.writeSSE(chunk)
		return
	}
	if !u.truncated && len(u.buf)+len(chunk) <= maxJSONResponseHold {
		u.buf = append(u.buf, chunk...)
		return
	}
	u.truncated = true
	u.buf = append(u.buf, chunk...)
	if len(u.buf) > responseTailBytes {
		n := copy(u.buf, u.buf[len(u.buf)-responseTailBytes:])
		u.buf = u.buf[:n]
	}
}

func (u *usageReader) writeSSE(chunk []byte) {
	for len(chunk) > 0 {
		nl := bytes.IndexByte(chunk, '\n')
		if nl < 0 {
			if !u.skipLine {
				if len(u.buf)+len(chunk) > maxSSELineBytes {
					u.skipLine, u.buf = true, u.buf[:0]
				} else {
					u.buf = append(u.buf, chunk...)
				}
			}
			return
		}
		if u.skipLine {
			u.skipLine = false
		} else if len(u.buf) == 0 {
			u.line(chunk[:nl])
		} else {
			u.buf = append(u.buf, chunk[:nl]...)
			u.line(u.buf)
		}
		u.buf = u.buf[:0]
		chunk = chunk[nl+1:]
	}
}

var (
	dataPrefix = []byte("data:")
	doneMarker = []byte("[DONE]")
	usageKey   = []byte(`"usage"`)
)

// line handles one SSE line: a data event before [DONE] that carries a
// non-null usage replaces any earlier one, so the last one wins.
func (u *usageReader) line(l []byte) {
	l = bytes.TrimRight(l, "\r")
	if u.done || !bytes.HasPrefix(l, dataPrefix) {
		return
	}
	data := bytes.TrimSpace(l[len(dataPrefix):])
	if bytes.Equal(data, doneMarker) {
		u.done = true
		return
	}
	if !bytes.Contains(data, usageKey) {
		return
	}
	u.parseUsageObject(data)
}

func (u *usageReader) parseUsageObject(doc []byte) bool {
	var v struct {
		Usage *Usage `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return false
	}
	u.usage, u.hasUsage = *v.Usage, true
	return true
}

// finish parses what was kept of a non-streamed body and returns the usage.
func (u *usageReader) finish() (Usage, bool) {
	if u.sse {
		if len(u.buf) > 0 && !u.skipLine {
			u.line(u.buf) // a last event without a trailing newline
			u.buf = u.buf[:0]
		}
		return u.usage, u.hasUsage
	}
	if u.hasUsage || len(u.buf) == 0 {
		return u.usage, u.hasUsage
	}
	if !u.truncated {
		u.parseUsageObject(u.buf)
		return u.usage, u.hasUsage
	}
	// Only the tail is here: find the last "usage" key and decode the
	// object that follows it (a Decoder reads one value and stops there).
	if i := bytes.LastIndex(u.buf, usageKey); i >= 0 {
		rest := bytes.TrimLeft(u.buf[i+len(usageKey):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			var us *Usage
			if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&us) == nil && us != nil {
				u.usage, u.hasUsage = *us, true
			}
		}
	}
	return u.usage, u.hasUsage
}
