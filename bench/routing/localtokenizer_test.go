// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/tokenize"
)

// llmdDummySplit is the llm-d simulator's tokenizer's regex (its
// pkg/tokenizer, the tokenizer it uses offline or with
// --force-dummy-tokenizer): a word or one punctuation character, with the
// whitespace after it, is a token, whose id is the FNV-1a (32 bits) hash of
// its text.
const llmdDummySplit = `(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`

// llmdDummyTokenizerJSON is a tokenizer.json (the Hugging Face format)
// that tokenizes as the llm-d simulator's tokenizer does any text of
// words: the pre-tokenizer splits by the simulator's own regex (each piece
// a token with its trailing whitespace), and the model is a BPE with
// ignore_merges and no merges, so a piece in the vocabulary is one token;
// the vocabulary is words, each alone and followed by one and two spaces
// (the workload's prompts join a prefix ending in a space and a suffix
// starting with one), with the FNV-1a hash of the piece as its id.
func llmdDummyTokenizerJSON(words []string) []byte {
	vocab := map[string]uint32{}
	for _, w := range words {
		for _, piece := range []string{w, w + " ", w + "  "} {
			h := fnv.New32a()
			h.Write([]byte(piece))
			vocab[piece] = h.Sum32()
		}
	}
	b, _ := json.Marshal(map[string]any{
		"version":       "1.0",
		"pre_tokenizer": map[string]any{"type": "Split", "pattern": map[string]string{"Regex": llmdDummySplit}, "behavior": "Isolated", "invert": false},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}, "ignore_merges": true},
	})
	return b
}

// workloadWords are the pieces of the harness's ordinary-words prompts
// (-ordinary-words): commonWords, the words of their heads ("system prompt
// 3: ", " question 17: "), the numbers up to n and the colon.
func workloadWords(n int) []string {
	words := slices.Concat(commonWords, []string{"system", "prompt", "question", "answer", ":"})
	for i := range n {
		words = append(words, strconv.Itoa(i))
	}
	return words
}

// TestLLMDLocalTokenizer runs poolpicker's precise configuration with the
// in-process tokenizer (tokenizer.backend local: no render round trip can
// be made, a prompt no local tokenizer reads is scored by the learned index
// and counted) on the llm-d simulator, when LLMD_SIM_BIN names its binary.
// The tokenizer.json is derived from the simulator's tokenizer and the
// workload's words (llmdDummyTokenizerJSON); first its ids are checked
// against a simulator's render endpoint on the workload's prompts, then
// the fleet runs through the picker's ext_proc: every pick is tokenized in
// process, the event index predicts cached tokens, and the servers confirm
// at least 0.98 of them.
func TestLLMDLocalTokenizer(t *testing.T) {
	bin := os.Getenv("LLMD_SIM_BIN")
	if bin == "" {
		t.Skip("LLMD_SIM_BIN not set")
	}
	c := defaultSweep()
	c.sim, c.llmdBin, c.requests, c.timeScale, c.parallel = simLLMD, bin, 80, 1, false
	c.ordinaryWords = true
	const groups = 6
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, llmdDummyTokenizerJSON(workloadWords(c.requests)), 0o600); err != nil {
		t.Fatal(err)
	}
	local, err := tokenize.LoadLocal(path)
	if err != nil {
		t.Fatal(err)
	}

	// The ids agree with the simulator's own on the workload's prompts.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := startLLMD(ctx, bin, &c, 0, ln, "tokenizer-check", 1, "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	for i, r := range workload(&c, groups, 0.3)[:5] {
		var body struct {
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatal(err)
		}
		want := llmdRender(t, ln.Addr().String(), body.Prompt)
		got, err := local.Encode(body.Prompt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("request %d: %d local tokens, the simulator's render %d; first difference at %s", i, len(got), len(want), firstDifference(got, want))
		}
	}
	sim.Stop()

	config, err := localTokenizerConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	precise := router{name: preciseRouterName, config: config, kvEvents: true}
	c.routers, c.replicas = []router{precise}, []int{1}
	rs, err := runPoint(ctx, &c, groups, 0.3, false)
	if err != nil {
		t.Fatal(err)
	}
	assertPreciseRoutedFromEvents(t, rs[0], "the local tokens' keys")
}

// localTokenizerConfig is configs/precise.yaml with the local tokenizer
// backend reading the tokenizer.json at path for the servers' model.
func localTokenizerConfig(path string) (string, error) {
	text, err := os.ReadFile(filepath.Join("configs", "precise.yaml"))
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return "", err
	}
	plugins, _ := doc["plugins"].([]any)
	for _, p := range plugins {
		plugin, _ := p.(map[string]any)
		if plugin == nil || plugin["type"] != "precise-prefix-cache-scorer" {
			continue
		}
		params := child(plugin, "parameters")
		child(params, "tokenizer")["backend"] = "local"
		local := child(child(child(params, "indexerConfig"), "tokenizersPoolConfig"), "local")
		local["autoDiscoveryDir"] = filepath.Dir(path) + "/absent"
		local["modelTokenizerMap"] = map[string]string{modelsim.DefaultModel: path}
	}
	b, err := yaml.Marshal(doc)
	return string(b), err
}

// llmdRender is the llm-d simulator's render of a completion's prompt.
func llmdRender(t *testing.T, addr, prompt string) []uint32 {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"model": modelsim.DefaultModel, "prompt": prompt})
	resp, err := http.Post("http://"+addr+"/v1/completions/render", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("render: %d %s %v", resp.StatusCode, b, err)
	}
	var out []struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out) == 0 {
		var one struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		if err := json.Unmarshal(b, &one); err != nil {
			t.Fatalf("render answer %.200s: %v", b, err)
		}
		return one.TokenIDs
	}
	return out[0].TokenIDs
}

func firstDifference(a, b []uint32) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("token %d (%d against %d)", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("token %d (one ends)", min(len(a), len(b)))
}
