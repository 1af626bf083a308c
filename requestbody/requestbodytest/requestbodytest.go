// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package requestbodytest holds the behaviour every requestbody.Reader must
// have, as a test suite, with the bodies its tests and benchmarks use.
package requestbodytest

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/requestbody"
)

// Suite runs the cases against one Reader implementation.
type Suite struct {
	// New returns a Reader for one body.
	New func(kind requestbody.Kind, promptLimit int) requestbody.Reader
	// Skims says the reader only skims past the prompt limit, as
	// requestbody.Scanner does, so it must forward a body whose only
	// defect lies there. Zero: such a body may be forwarded or refused.
	Skims bool
	// OwnMessages says the reader's syntax errors are worded as the
	// cases expect (requestbody.Scanner's). Zero: any error will do for a
	// syntax error; the picker's own checks (no model, not an object,
	// messages not an array...) are worded alike by every reader.
	OwnMessages bool
}

// Case is one body and what a reader makes of it.
type Case struct {
	Name  string
	Kind  requestbody.Kind
	Body  string
	Limit int
	// What is read, when Err is empty.
	Model, Prompt string
	Stream        bool
	// Err is part of the error's message; the body is refused.
	Err string
	// Syntax: Err is a JSON syntax error, worded by the reader.
	Syntax bool
	// Skimmed: the body's only defect lies past the prompt limit; a
	// reader that skims there forwards it.
	Skimmed bool
}

// Cases are the table every reader passes.
func Cases() []Case {
	all := math.MaxInt
	long := strings.Repeat("0123456789", 10) // 100 bytes
	huge := `[` + strings.Repeat(`{"role":"user","content":"`+long+`\"\\\"\\ ]} \n"},`, 10000) + `{"role":"a","content":"end"}]`
	cs := []Case{
		{Name: "completion", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m","prompt":"hi there","stream":true}`, Model: "m", Prompt: `"hi there"`, Stream: true},
		{Name: "completion array prompt", Kind: requestbody.Completions, Limit: all, Body: `{"prompt":["a","b"],"model":"m"}`, Model: "m", Prompt: `["a","b"]`},
		{Name: "token prompt", Kind: requestbody.Completions, Limit: all, Body: `{"prompt":[1, 2,3],"model":"m"}`, Model: "m", Prompt: "[1, 2,3]"},
		{Name: "escapes kept", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m\u00e9","prompt":"a\nb\"c\ud83d\ude00"}`, Model: "mé", Prompt: `"a\nb\"c\ud83d\ude00"`},
		{Name: "chat", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			Model: "m", Prompt: `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]`},
		{Name: "chat ignores prompt field", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","prompt":"no","messages":[ ]}`, Model: "m", Prompt: "[ ]"},
		{Name: "completion ignores messages field", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m","prompt":"p","messages":[]}`, Model: "m", Prompt: `"p"`},
		{Name: "duplicate model: last wins", Kind: requestbody.Completions, Limit: all, Body: `{"model":"a","model":"b"}`, Model: "b"},
		{Name: "escaped key", Kind: requestbody.Completions, Limit: all, Body: `{"mo\u0064el":"m"}`, Model: "m"},
		{Name: "a plain key, then an escaped one", Kind: requestbody.Completions, Limit: all, Body: `{"a":1,"mod\u0065l":"m","prompt":"p"}`, Model: "m", Prompt: `"p"`},
		{Name: "embeddings", Kind: requestbody.ModelOnly, Limit: all, Body: `{"model":"e","input":"x"}`, Model: "e"},
		{Name: "no path", Kind: requestbody.NoPath, Limit: all, Body: `{"model":"m","messages":[{"role":"user","content":"q"}]}`, Model: "m", Prompt: `[{"role":"user","content":"q"}]`},
		{Name: "unknown path not json", Kind: requestbody.Unknown, Limit: all, Body: `--boundary`},
		{Name: "unknown path model", Kind: requestbody.Unknown, Limit: all, Body: `{"model":"m"}`, Model: "m"},
		{Name: "unknown path empty model", Kind: requestbody.Unknown, Limit: all, Body: `{"model":""}`},
		{Name: "truncated", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m"`, Err: "unexpected end", Syntax: true},
		{Name: "trailing data", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m"} x`, Err: "after the top-level", Syntax: true},
		{Name: "array", Kind: requestbody.Chat, Limit: all, Body: `[]`, Err: "not a JSON object"},
		{Name: "string", Kind: requestbody.Chat, Limit: all, Body: ` "model"`, Err: "not a JSON object"},
		{Name: "empty", Kind: requestbody.Chat, Limit: all, Body: ``, Err: "empty"},
		{Name: "only whitespace", Kind: requestbody.Chat, Limit: all, Body: " \n", Err: "empty"},
		{Name: "missing model", Kind: requestbody.Chat, Limit: all, Body: `{"messages":[]}`, Err: `no "model"`},
		{Name: "model only nested", Kind: requestbody.ModelOnly, Limit: all, Body: `{"input":{"model":"m"}}`, Err: `no "model"`},
		{Name: "empty model", Kind: requestbody.Chat, Limit: all, Body: `{"model":""}`, Err: `"model" is empty`},
		{Name: "model number", Kind: requestbody.Chat, Limit: all, Body: `{"model":1}`, Err: "must be a string"},
		{Name: "model null", Kind: requestbody.Completions, Limit: all, Body: `{"model":null}`, Err: "must be a string"},
		{Name: "model not UTF-8", Kind: requestbody.Chat, Limit: all, Body: "{\"model\":\"m\xff\"}", Err: "UTF-8"},
		{Name: "message not an object", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","messages":[{"role":"u"},"x"]}`, Err: `each of "messages" must be an object`},
		{Name: "messages not array", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","messages":{}}`, Err: "must be an array"},
		{Name: "bad escape in prompt", Kind: requestbody.Completions, Limit: all, Body: `{"model":"m","prompt":"a\q"}`, Err: "bad escape", Syntax: true},
		{Name: "bad number", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","n":01}`, Err: "invalid JSON", Syntax: true},
		{Name: "control char", Kind: requestbody.Chat, Limit: all, Body: "{\"model\":\"m\x01\"}", Err: "control character", Syntax: true},
		{Name: "deep nesting", Kind: requestbody.Chat, Limit: all, Body: `{"model":"m","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, Err: "nesting", Syntax: true},

		// Past the prompt limit.
		{Name: "escaped quotes and backslashes", Kind: requestbody.Chat, Limit: 5, Model: "m", Prompt: `[{"ro`, Stream: true,
			Body: `{"messages":[{"role":"u","content":"` + long + `\\\"\\\\\"\\"},{"role":"a","content":"\"],\"model\":\"no\"}"}],"model":"m","stream":true}`},
		{Name: "backslashes right before the limit", Kind: requestbody.Completions, Limit: 3, Model: "m", Prompt: `"a\`,
			Body: `{"prompt":"a\\\\\\\"","model":"m"}`},
		{Name: "nested arrays and brackets in strings", Kind: requestbody.Chat, Limit: 5, Model: "m", Prompt: `[{"ro`, Stream: true,
			Body: `{"model":"x","messages":[{"role":"u","content":"` + long + `"}],"tools":[[1,[2,{"a":"]}"}]],{"b":["}",[[]]]}],"model":"m","stream":true}`},
		{Name: "model after a huge messages array", Kind: requestbody.Chat, Limit: 16 << 10, Model: "m", Stream: true, Prompt: huge[:16<<10],
			Body: `{"messages":` + huge + `,"stream":true,"model":"m"}`},
		{Name: "limit 0 skims the whole prompt", Kind: requestbody.Chat, Limit: 0, Model: "m", Skimmed: true,
			Body: `{"messages":[{"role":"u","content":"\q"},7,[}],"model":"m"}`},
		{Name: "embeddings skim the input", Kind: requestbody.ModelOnly, Limit: 16 << 10, Model: "e", Skimmed: true,
			Body: `{"input":["\q",01,{]],"model":"e"}`},
		{Name: "bad escape skimmed", Kind: requestbody.Completions, Limit: 5, Model: "m", Prompt: `"0123`, Skimmed: true, Body: `{"prompt":"` + long + `\x\u12","model":"m"}`},
		{Name: "control byte skimmed", Kind: requestbody.Chat, Limit: 5, Model: "m", Prompt: `[{"ro`, Skimmed: true, Body: "{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"" + long + "\x01\"}]}"},
		{Name: "bad number in skimmed value", Kind: requestbody.Chat, Limit: 5, Model: "m", Prompt: `[{"ro`, Skimmed: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"logit_bias":{"1":01},"model":"m"}`},
		{Name: "truncated skimmed string", Kind: requestbody.Chat, Limit: 5, Err: "unexpected end", Syntax: true, Body: `{"model":"m","messages":[{"role":"u","content":"` + long + `\"`},
		{Name: "truncated skimmed array", Kind: requestbody.Chat, Limit: 5, Err: "unexpected end", Syntax: true, Body: `{"model":"m","messages":[{"role":"u","content":"` + long + `"},[{"a":"]"}`},
		{Name: "truncated skimmed value", Kind: requestbody.Chat, Limit: 5, Err: "unexpected end", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m","tools":{"a":[`},
		{Name: "truncated after the skimmed value", Kind: requestbody.Chat, Limit: 5, Err: "unexpected end", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m"`},
		{Name: "not an object at limit 0", Kind: requestbody.Chat, Limit: 0, Err: "not a JSON object", Body: `["model","m"]`},
		{Name: "missing model after skimming", Kind: requestbody.Chat, Limit: 5, Err: `no "model"`, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"tools":{"model":"m"}}`},
		{Name: "model not a string after skimming", Kind: requestbody.Chat, Limit: 5, Err: "must be a string", Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":["m"]}`},
		{Name: "model still validated after skimming", Kind: requestbody.Chat, Limit: 5, Err: "bad escape", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m\q"}`},
		{Name: "stream still validated after skimming", Kind: requestbody.Chat, Limit: 5, Err: "want true", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m","stream":tru}`},
		{Name: "top level still validated after skimming", Kind: requestbody.Chat, Limit: 5, Err: "want ':'", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model" "m"}`},
		{Name: "trailing data after skimming", Kind: requestbody.Chat, Limit: 5, Err: "after the top-level", Syntax: true, Body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m"}]`},
	}
	// The prompt is the raw value cut exactly at the limit.
	for _, c := range []struct {
		name    string
		kind    requestbody.Kind
		value   string // the messages or prompt value
		tail    string // the body after the value; "}" unless set
		limit   int
		err     string
		syntax  bool
		skimmed bool
	}{
		{name: "chat cut in content", kind: requestbody.Chat, value: `[{"role":"user","content":"` + long + `"}]`, limit: 40},
		{name: "chat cut in a key", kind: requestbody.Chat, value: `[{"role":"user","content":"` + long + `"}]`, limit: 5},
		{name: "chat cut in a later message", kind: requestbody.Chat, value: `[{"role":"a","content":"xy"},{"role":"b","content":"` + long + `"}]`, limit: 40},
		{name: "chat cut between messages", kind: requestbody.Chat, value: `[{"role":"a","content":"xy"} , {"role":"b","content":"` + long + `"}]`, limit: 29},
		{name: "chat cut at an escape", kind: requestbody.Chat, value: `[{"role":"u","content":"ab\n\u00e9` + long + `"}]`, limit: 29},
		{name: "chat under the limit: whole", kind: requestbody.Chat, value: `[{"role":"u","content":"short"}]`, limit: 1000},
		{name: "completion cut", kind: requestbody.Completions, value: `"` + long + `"`, limit: 15},
		{name: "completion cut in an escape", kind: requestbody.Completions, value: `"ab\u00e9` + long + `"`, limit: 6},
		{name: "completion array cut", kind: requestbody.Completions, value: `["abc","` + long + `"]`, limit: 9},
		{name: "token array cut", kind: requestbody.Completions, value: `[101, 2023, 2003, 1037]`, limit: 8},
		{name: "zero: empty", kind: requestbody.Completions, value: `"` + long + `"`, limit: 0},
		{name: "completion under the limit: whole", kind: requestbody.Completions, value: `"short"`, limit: 100},
		{name: "limit one past the value", kind: requestbody.Completions, value: `"short"`, limit: 8},
		{name: "bad escape past the limit", kind: requestbody.Completions, value: `"` + long + `\x"`, limit: 5, skimmed: true},
		{name: "control byte past the limit", kind: requestbody.Chat, value: "[{\"role\":\"u\",\"content\":\"" + long + "\x01\"}]", limit: 5, skimmed: true},
		{name: "bad message past the limit", kind: requestbody.Chat, value: `[{"role":"u","content":"` + long + `"},3]`, limit: 40, skimmed: true},
		{name: "bad message before the limit", kind: requestbody.Chat, value: `[{"role":"u","content":"x"},3]`, limit: 40, err: "must be an object"},
		{name: "bad escape before the limit", kind: requestbody.Chat, value: `[{"role":"u","content":"x\q` + long + `"}]`, limit: 40, err: "bad escape", syntax: true},
		{name: "unterminated past the limit", kind: requestbody.Chat, value: `[{"role":"u","content":"` + long, tail: " ", limit: 5, err: "closing", syntax: true},
	} {
		key := `{"model":"m","messages":`
		if c.kind == requestbody.Completions {
			key = `{"model":"m","prompt":`
		}
		tail := c.tail
		if tail == "" {
			tail = "}"
		}
		cc := Case{Name: "prompt limit: " + c.name, Kind: c.kind, Body: key + c.value + tail, Limit: c.limit, Err: c.err, Syntax: c.syntax, Skimmed: c.skimmed}
		if c.err == "" {
			cc.Model, cc.Prompt = "m", c.value[:min(c.limit, len(c.value))]
		}
		cs = append(cs, cc)
	}
	return cs
}

// Run runs every case, whole and fed in pieces, then the prompt-sharing and
// rewrite tests.
func (s Suite) Run(t *testing.T) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) { s.check(t, c) })
	}
	t.Run("prompt prefix sharing", s.prefixSharing)
}

// Read feeds body to r whole, with final set, and returns the result.
func Read(r requestbody.Reader, body []byte) (*requestbody.Request, error) {
	_ = r.Feed(body, true) // the defect, if any, is Result's error
	return r.Result(body)
}

func (s Suite) check(t *testing.T, c Case) {
	body := []byte(c.Body)
	rb, err := Read(s.New(c.Kind, c.Limit), body)
	if string(body) != c.Body {
		t.Fatalf("reading changed the body (which is forwarded): %q", body)
	}
	switch {
	case c.Err != "":
		if err == nil {
			t.Fatalf("read %+v, want an error containing %q", rb, c.Err)
		}
		if (!c.Syntax || s.OwnMessages) && !strings.Contains(err.Error(), c.Err) {
			t.Fatalf("err %v, want one containing %q", err, c.Err)
		}
	case err != nil && c.Skimmed && !s.Skims:
		// A reader that validates everything refuses it: also a right answer.
		t.Logf("refused a defect past the prompt limit: %v", err)
	case err != nil:
		t.Fatal(err)
	default:
		s.checkRequest(t, c, body, rb)
	}
	// Fed in pieces, as a gateway cuts a body anywhere, each appended to
	// a buffer that moves as it grows: the same answer.
	for _, step := range []int{1, 7, 4096} {
		if len(body)/step > 10000 {
			continue
		}
		r := s.New(c.Kind, c.Limit)
		var early error
		var joined []byte
		for end := min(step, len(body)); ; end = min(end+step, len(body)) {
			joined = append(joined, body[len(joined):end]...)
			if err := r.Feed(joined, false); err != nil && early == nil {
				early = err
			}
			if end == len(body) {
				break
			}
		}
		_ = r.Feed(body, true)
		got, gotErr := r.Result(body)
		if (gotErr == nil) != (err == nil) || (err != nil && gotErr.Error() != err.Error()) {
			t.Fatalf("in pieces of %d: %v, whole: %v", step, gotErr, err)
		}
		if early != nil && (err == nil || early.Error() != err.Error()) && c.Kind.Strict() {
			t.Fatalf("in pieces of %d: a piece reported %v, the whole body %v", step, early, err)
		}
		if err == nil && (got.Model != rb.Model || string(got.Prompt) != string(rb.Prompt) || got.Stream != rb.Stream || got.ModelStart != rb.ModelStart || got.ModelEnd != rb.ModelEnd) {
			t.Fatalf("in pieces of %d: %+v, whole: %+v", step, got, rb)
		}
	}
}

func (s Suite) checkRequest(t *testing.T, c Case, body []byte, rb *requestbody.Request) {
	if rb.Model != c.Model || string(rb.Prompt) != c.Prompt || rb.Stream != c.Stream {
		t.Fatalf("got model %q prompt %q stream %v, want %q %q %v", rb.Model, rb.Prompt, rb.Stream, c.Model, c.Prompt, c.Stream)
	}
	// Zero-copy: the prompt is the body's bytes, and cannot be appended
	// to in place.
	if len(rb.Prompt) > 0 {
		if !aliases(body, rb.Prompt) {
			t.Fatal("the prompt is a copy, not a slice of the body")
		}
		if cap(rb.Prompt) != len(rb.Prompt) {
			t.Fatalf("prompt cap %d > len %d: an append would write into the body", cap(rb.Prompt), len(rb.Prompt))
		}
	}
	if !rb.HasModel() {
		if c.Model != "" || c.Kind.Strict() {
			t.Fatal("no model span")
		}
		return
	}
	// A rewrite replaces exactly the model value, wherever it is.
	var was string
	if err := json.Unmarshal(body[rb.ModelStart:rb.ModelEnd], &was); err != nil || was != c.Model {
		t.Fatalf("the model span holds %q", body[rb.ModelStart:rb.ModelEnd])
	}
	out := rb.RewriteModel(body, `new"one`)
	if want := c.Body[:rb.ModelStart] + `"new\"one"` + c.Body[rb.ModelEnd:]; string(out) != want {
		t.Fatalf("rewrite: %s", out)
	}
	if json.Valid(body) {
		var after struct{ Model string }
		if err := json.Unmarshal(out, &after); err != nil || after.Model != `new"one` {
			t.Fatalf("rewritten body: model %q, err %v", after.Model, err)
		}
	}
}

// aliases reports whether p starts inside b.
func aliases(b, p []byte) bool {
	for i := range b {
		if &b[i] == &p[0] {
			return true
		}
	}
	return false
}

// prefixSharing: the prompt is the raw JSON of the messages (or prompt
// value), so requests that extend a conversation, serialized the same way,
// share every byte up to where they differ; other top-level fields do not
// matter, and a different serialization is a different prompt.
func (s Suite) prefixSharing(t *testing.T) {
	sys := `{"role":"system","content":"You are a helpful assistant.\n"}`
	u1 := `{"role":"user","content":"What is \"KV cache\"?"}`
	a1 := `{"role":"assistant","content":"A cache of attention keys and values."}`
	u2 := `{"role":"user","content":"How big is it?"}`
	for _, c := range []struct {
		name         string
		kind         requestbody.Kind
		first, other string
		common       int // bytes both prompts share from the start
	}{
		{"chat turn 2 extends turn 1", requestbody.Chat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"stream":true,"messages":[` + sys + `,` + u1 + `,` + a1 + `,` + u2 + `],"model":"m","max_tokens":9}`,
			len(`[` + sys + `,` + u1)},
		{"chat same system prompt", requestbody.Chat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"model":"m","messages":[` + sys + `,` + u2 + `]}`,
			len(`[` + sys + `,{"role":"user","content":"`)},
		{"chat other key order differs at that message", requestbody.Chat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"model":"m","messages":[` + sys + `,{"content":"What is \"KV cache\"?","role":"user"}]}`,
			len(`[` + sys + `,{"`)},
		{"completion and its extension", requestbody.Completions,
			`{"model":"m","prompt":"Once upon a time"}`,
			`{"model":"m","prompt":"Once upon a time, there was","temperature":0}`,
			len(`"Once upon a time`)},
	} {
		a, err := Read(s.New(c.kind, math.MaxInt), []byte(c.first))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Read(s.New(c.kind, math.MaxInt), []byte(c.other))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for n < min(len(a.Prompt), len(b.Prompt)) && a.Prompt[n] == b.Prompt[n] {
			n++
		}
		if n != c.common {
			t.Errorf("%s: prompts %q and %q share %d bytes, want %d", c.name, a.Prompt, b.Prompt, n, c.common)
		}
	}
}

// ChatBody is a chat request of size bytes whose user content is words
// with a JSON escape every few words (newlines, quotes), as real prompts
// have, or plain words when plain is set.
func ChatBody(size int, plain bool) []byte {
	head := `{"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":128,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}],"stream":false}`
	words := []string{"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dogs ", `\n`, `\"q\" `}
	if plain {
		words = words[:8]
	}
	var sb strings.Builder
	for i := 0; sb.Len() < size-len(head)-len(tail); i++ {
		sb.WriteString(words[i%len(words)])
	}
	content := sb.String()[:size-len(head)-len(tail)]
	content = strings.TrimRight(content, `\`) // never cut an escape in half
	return []byte(head + content + tail)
}

// Benchmark reads ChatBody bodies of 1 and 64 KiB whole, without and with
// the default scheduler's prompt limit (256 blocks of 64 bytes).
func Benchmark(b *testing.B, newReader func(kind requestbody.Kind, promptLimit int) requestbody.Reader) {
	for _, c := range []struct {
		size  int
		plain bool
		limit int
	}{
		{1 << 10, false, math.MaxInt}, {64 << 10, false, math.MaxInt}, {64 << 10, true, math.MaxInt},
		{64 << 10, false, 16 << 10}, {64 << 10, true, 16 << 10},
	} {
		name := fmt.Sprintf("chat-%dKiB", c.size>>10)
		if c.plain {
			name += "-plain"
		}
		if c.limit != math.MaxInt {
			name += fmt.Sprintf("-limit-%dKiB", c.limit>>10)
		}
		body := ChatBody(c.size, c.plain)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Read(newReader(requestbody.Chat, c.limit), body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
