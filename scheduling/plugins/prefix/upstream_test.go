// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// TestUpstreamParams: the reference EPP's and the llm-d router's parameter
// names are read as the scorer's own.
func TestUpstreamParams(t *testing.T) {
	cases := []struct {
		params            string
		hashBlock, blocks int
		wantErr           string
	}{
		{`{"blockSizeTokens": 5}`, 20, DefaultMaxPrefixBlocksToMatch, ""},
		{`{"blockSizeTokens": 16, "bytesPerToken": 2, "maxPrefixTokensToMatch": 1024}`, 32, 64, ""},
		{`{"blockSize": 100}`, 100, DefaultMaxPrefixBlocksToMatch, ""},
		{`{"blockSizeTokens": 5, "hashBlockSize": 48}`, 48, DefaultMaxPrefixBlocksToMatch, ""},
		{`{"blockSizeTokens": "many"}`, 0, 0, "parameters: blockSizeTokens"},
		{`{"blockSizeToken": 5}`, 0, 0, `unknown field "blockSizeToken"`},
	}
	for _, c := range cases {
		t.Run(c.params, func(t *testing.T) {
			p, err := New("p", json.RawMessage(c.params), framework.NewHandle(t.Context(), logr.Discard(), nil))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.(*Scorer).params; got.HashBlockSize != c.hashBlock || got.MaxPrefixBlocksToMatch != c.blocks {
				t.Fatalf("hashBlockSize %d, maxPrefixBlocksToMatch %d; want %d, %d", got.HashBlockSize, got.MaxPrefixBlocksToMatch, c.hashBlock, c.blocks)
			}
		})
	}
}

// TestParams: a config's parameters reach the scorer, and those it leaves
// out take their documented defaults.
func TestParams(t *testing.T) {
	p, err := New("p", json.RawMessage(`{"hashBlockSize": 32, "maxPrefixBlocksToMatch": 128, "lruCapacityPerServer": 1000}`), framework.NewHandle(t.Context(), logr.Discard(), nil))
	if err != nil {
		t.Fatal(err)
	}
	params := p.(*Scorer).Params()
	if params.HashBlockSize != 32 || params.MaxPrefixBlocksToMatch != 128 || params.LRUCapacityPerServer != 1000 || !*params.AutoTune || !*params.UsageFeedback || params.QueueMissCost {
		t.Fatalf("prefix params %+v", params)
	}
}
