// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The fixtures under testdata are small tokenizer.json files in the two
// shapes Local reads: byte-level BPE split by Llama 3's regex with a BOS
// template (bytelevel), and SentencePiece-style BPE with a metaspace
// normalizer and byte fallback (sentencepiece), their merges learned from
// this repository's README. expected.json holds the ids that an independent
// implementation of the format (the tokenizers of transformers.js, as
// @lenml/tokenizers 3.7.2 packages them) gives for each text.
func TestLocalMatchesReference(t *testing.T) {
	b, err := os.ReadFile("testdata/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var expected map[string][]struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	}
	if err := json.Unmarshal(b, &expected); err != nil {
		t.Fatal(err)
	}
	for _, fixture := range []string{"bytelevel", "sentencepiece"} {
		t.Run(fixture, func(t *testing.T) {
			l, err := LoadLocal(filepath.Join("testdata", fixture, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			cases := expected[fixture]
			if len(cases) < 10 {
				t.Fatalf("%d expected cases", len(cases))
			}
			for _, c := range cases {
				got, err := l.Encode(c.Text)
				if err != nil {
					t.Errorf("%q: %v", c.Text, err)
					continue
				}
				if !slices.Equal(got, c.IDs) {
					t.Errorf("%q:\n got %v\nwant %v", c.Text, got, c.IDs)
				}
			}
		})
	}
}

func TestLocalRefusesWhatItDoesNotKnow(t *testing.T) {
	base, err := os.ReadFile("testdata/bytelevel/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	// edit returns base with one top-level field replaced.
	edit := func(field, value string) []byte {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		m[field] = json.RawMessage(value)
		out, _ := json.Marshal(m)
		return out
	}
	for _, tt := range []struct {
		name string
		file []byte
		want string
	}{
		{"not JSON", []byte("{"), "not a tokenizer.json"},
		{"a WordPiece model", edit("model", `{"type":"WordPiece","vocab":{"a":0}}`), `model type "WordPiece"`},
		{"an empty vocabulary", edit("model", `{"type":"BPE","vocab":{},"merges":[]}`), "empty vocabulary"},
		{"a merge outside the vocabulary", edit("model", `{"type":"BPE","vocab":{"a":0},"merges":["a b"]}`), "not in the vocabulary"},
		{"dropout", edit("model", `{"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]}`), "dropout"},
		{"an unknown normalizer", edit("normalizer", `{"type":"BertNormalizer"}`), `normalizer: type "BertNormalizer"`},
		{"a regex Replace", edit("normalizer", `{"type":"Replace","pattern":{"Regex":" +"},"content":" "}`), "only a string pattern"},
		{"an unknown pre-tokenizer", edit("pre_tokenizer", `{"type":"Metaspace"}`), `pre_tokenizer: type "Metaspace"`},
		{"a merged split", edit("pre_tokenizer", `{"type":"Split","pattern":{"Regex":"a"},"behavior":"MergedWithPrevious","invert":false}`), "only Isolated"},
		{"a bad regex", edit("pre_tokenizer", `{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated"}`), "Split"},
		{"an unknown post processor", edit("post_processor", `{"type":"RobertaProcessing"}`), `post_processor: type "RobertaProcessing"`},
		{"an undefined special token", edit("post_processor", `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<x>"}}],"special_tokens":{}}`), `"<x>" not defined`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseLocal(tt.file)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
	if _, err := LoadLocal(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing file loaded")
	}
}

// FuzzLocalEncode: any text encodes without a panic, and the ids are the
// vocabulary's.
func FuzzLocalEncode(f *testing.F) {
	l, err := LoadLocal("testdata/bytelevel/tokenizer.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"", "hello world", "<|eot_id|>x", "\xff\xfe", "  \n\t 123456"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := l.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if int(id) >= len(l.vocab)+len(l.addedIDs) {
				t.Fatalf("id %d beyond the vocabulary", id)
			}
		}
	})
}

func TestDiscover(t *testing.T) {
	dir := t.TempDir()
	tok, err := os.ReadFile("testdata/bytelevel/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"llama-7b/tokenizer.json",
		"Qwen/Qwen3/tokenizer.json",
		"hub/models--Qwen--Qwen3-0.6B/snapshots/abc123/tokenizer.json",
		"other/vocab.json",
	} {
		path := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, tok, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Discover(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"llama-7b":        filepath.Join(dir, "llama-7b/tokenizer.json"),
		"Qwen/Qwen3":      filepath.Join(dir, "Qwen/Qwen3/tokenizer.json"),
		"Qwen/Qwen3-0.6B": filepath.Join(dir, "hub/models--Qwen--Qwen3-0.6B/snapshots/abc123/tokenizer.json"),
	}
	if len(got) != len(want) {
		t.Errorf("found %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if got, err := Discover(filepath.Join(dir, "absent"), ""); err != nil || len(got) != 0 {
		t.Errorf("a missing directory: %v %v", got, err)
	}
}

func TestRendererWithLocal(t *testing.T) {
	l, err := LoadLocal("testdata/bytelevel/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = w.Write([]byte(`{"token_ids":[1,2,3]}`))
	}))
	defer srv.Close()
	ctx := context.Background()
	text := "poolpicker picks the endpoint of an InferencePool for each request."
	want, _ := l.Encode(text)
	for _, tt := range []struct {
		name      string
		localOnly bool
		model     string
		raw       string
		want      []uint32
		requests  int64
		err       string
	}{
		{name: "a completion in process", model: "m", raw: fmt.Sprintf("%q", text), want: want},
		{name: "a list of prompts, the first", model: "m", raw: fmt.Sprintf("[%q, \"x\"]", text), want: want},
		{name: "chat needs the template: rendered", model: "m", raw: `[{"role":"user","content":"hi"}]`, want: []uint32{1, 2, 3}, requests: 1},
		{name: "another model: rendered", model: "other", raw: `"hi"`, want: []uint32{1, 2, 3}, requests: 1},
		{name: "local only: chat refused", localOnly: true, model: "m", raw: `[{"role":"user","content":"hi"}]`, err: ErrNoTokenizer.Error()},
		{name: "local only: another model refused", localOnly: true, model: "other", raw: `"hi"`, err: ErrNoTokenizer.Error()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			requests.Store(0)
			r, err := New(Options{Timeout: 10 * time.Second, Client: srv.Client(), Local: map[string]*Local{"m": l}, LocalOnly: tt.localOnly})
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Tokens(ctx, srv.URL, tt.model, []byte(tt.raw))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !got.Whole || !slices.Equal(got.IDs, tt.want) {
				t.Errorf("got %v (whole %v) %v, want %v", got.IDs, got.Whole, err, tt.want)
			}
			if n := requests.Load(); n != tt.requests {
				t.Errorf("%d round trips, want %d", n, tt.requests)
			}
		})
	}
	// Past the budget the tokenizer gives up: the pick scores without it.
	r, _ := New(Options{Timeout: time.Nanosecond, Local: map[string]*Local{"m": l}})
	long := strings.Repeat("many words in a long prompt ", 20000)
	if _, err := r.Tokens(ctx, srv.URL, "m", []byte(fmt.Sprintf("%q", long))); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("a prompt past the budget: err = %v", err)
	}
}
