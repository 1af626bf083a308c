// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Configs written for the reference EPP and the llm-d router give the
// block size in tokens (blockSizeTokens, maxPrefixTokensToMatch) or in
// characters (blockSize); the scorer reads them as its own parameters.

// upstreamParams rewrites, in place, upstream prefix-cache-scorer parameters
// to the scorer's own, before they are decoded strictly: a block
// of blockSizeTokens tokens is blockSizeTokens × bytesPerToken (upstream
// assumes 4) bytes of prompt; blockSize is its older size in characters;
// maxPrefixTokensToMatch, when set, gives the block count in tokens.
func upstreamParams(p map[string]json.RawMessage) error {
	num := func(key string) (int, bool, error) {
		raw, ok := p[key]
		if !ok {
			return 0, false, nil
		}
		var n int
		if err := json.Unmarshal(raw, &n); err != nil {
			return 0, true, fmt.Errorf("parameters: %s: %w", key, err)
		}
		delete(p, key)
		return n, true, nil
	}
	bytesPerToken := 4
	if raw, ok := p["bytesPerToken"]; ok {
		if err := json.Unmarshal(raw, &bytesPerToken); err != nil {
			return fmt.Errorf("parameters: bytesPerToken: %w", err)
		}
	}
	tokens, hasTokens, err := num("blockSizeTokens")
	if err != nil {
		return err
	}
	chars, hasChars, err := num("blockSize")
	if err != nil {
		return err
	}
	maxTokens, hasMaxTokens, err := num("maxPrefixTokensToMatch")
	if err != nil {
		return err
	}
	if _, set := p["hashBlockSize"]; !set {
		switch {
		case hasTokens && tokens > 0:
			p["hashBlockSize"] = json.RawMessage(strconv.Itoa(tokens * bytesPerToken))
		case hasChars && chars > 0:
			p["hashBlockSize"] = json.RawMessage(strconv.Itoa(chars))
		}
	}
	if hasMaxTokens && maxTokens > 0 && hasTokens && tokens > 0 {
		p["maxPrefixBlocksToMatch"] = json.RawMessage(strconv.Itoa(max(maxTokens/tokens, 1)))
	}
	return nil
}

// translateUpstream returns raw with upstream parameter names read as the
// scorer's (upstreamParams).
func translateUpstream(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return raw, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	if err := upstreamParams(m); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}
