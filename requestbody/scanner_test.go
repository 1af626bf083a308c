// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestbody_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/requestbody"
	"github.com/poolpicker/poolpicker/requestbody/requestbodytest"
)

func newScanner(kind requestbody.Kind, promptLimit int) requestbody.Reader {
	return requestbody.NewScanner(kind, promptLimit)
}

func TestScanner(t *testing.T) {
	requestbodytest.Suite{New: newScanner, Skims: true, OwnMessages: true}.Run(t)
}

func TestKindOf(t *testing.T) {
	for path, want := range map[string]requestbody.Kind{
		"": requestbody.NoPath, "/v1/completions": requestbody.Completions, "/v1/chat/completions/": requestbody.Chat,
		"/v1/chat/completions?x=1": requestbody.Chat, "/v1/embeddings#f": requestbody.ModelOnly, "/v1/responses": requestbody.ModelOnly,
		"/v1/models": requestbody.Unknown, "/": requestbody.Unknown, "/v1/chat/completions/x": requestbody.Unknown,
	} {
		if got := requestbody.KindOf(path); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", path, got, want)
		}
	}
}

func BenchmarkScanner(b *testing.B) { requestbodytest.Benchmark(b, newScanner) }

// seeds are bodies that reach every branch of the scanner.
var seeds = []string{
	`{"model":"m","prompt":"p"}`, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"t"}]}]}`,
	`{"model":"\ud800"}`, `{"model":"a\/b","x":-1.5e+3,"y":[true,false,null]}`, `{`, `{"a":1,}`, `[1]`, `"x"`, `{"model":"m"}}`,
	`{"model":"m","n":-0.0E-0}`, " \t{\"model\" :\n\"m\" }\r\n",
	`{"model":"m","messages":[{"content":"c first","role":"r"},{"role":"u","content":"a\nb\"c\ud83d\ude00 plain text past sixteen bytes"}]}`,
	`{"model":"m","prompt":"0123456789abcdef0123\t\u00e9x"}`, `{"model":"m","prompt":["ab\n","cd"]}`,
	`{"model":"m","messages":[{"role":"u","content":"x","content":"y"}]}`, `{"model":"m","prompt":"a\u12"}`,
	// Skimmed past a limit of 0..64: escaped quotes and backslashes,
	// brackets inside strings, defects only a validator sees.
	`{"messages":[{"role":"u","content":"0123456789abcdef0123456789\\\"]}\\"},{"x":["]",{"}":1}]}],"model":"m","stream":true}`,
	`{"prompt":"0123456789\\\\\"x\q\u12","t":[[1,01],{"a":"\z"}],"model":"m"}`,
	`{"model":"m","messages":[{"role":"u","content":"0123456789abcdef"},3,[}],"stream":true}`,
	`{"model":"m","prompt":"0123456789\\\"`, `{"model":"m","input":[1,2,"\\"],"x":{"y":[`,
	// A plain key, then an escaped one: unescaping must not write into
	// the body.
	`{"a":1,"mod\u0065l":"m","prompt":"p"}`,
}

var kinds = []requestbody.Kind{requestbody.Completions, requestbody.Chat, requestbody.NoPath, requestbody.Unknown, requestbody.ModelOnly}

// FuzzParse holds the scanner equal to encoding/json on validity and on
// the model it extracts.
func FuzzParse(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Paths without a prompt skim all but model and stream at any limit.
		checkSkimmed(t, body, requestbody.ModelOnly, 0, nil, nil)
		for _, kind := range kinds[:4] {
			// Without a limit the prompt is never full, so nothing is
			// skimmed on prompt paths: this is the fully validating parser.
			before := string(body)
			rb, skimmed, err := requestbody.ParseSkimming(body, kind, math.MaxInt)
			if string(body) != before {
				t.Fatalf("parsing changed the body (which is forwarded): %q, was %q", body, before)
			}
			if err == nil && kind != requestbody.Unknown && len(skimmed) != 0 {
				t.Fatalf("skimmed %v without a limit", skimmed)
			}
			for _, limit := range []int{0, 1, 7, 64} {
				checkSkimmed(t, body, kind, limit, rb, err)
			}
			var obj map[string]json.RawMessage
			objErr := json.Unmarshal(body, &obj)
			if !kind.Strict() {
				if err != nil {
					t.Fatalf("lenient parse failed: %v", err)
				}
				continue
			}
			if objErr != nil {
				if err == nil {
					t.Fatalf("accepted invalid JSON %q (encoding/json: %v)", body, objErr)
				}
				continue
			}
			// The map keeps keys as written (a struct field would also
			// take "modeL"; the parser, like model servers, wants "model").
			rawModel := obj["model"]
			var model string
			modelIsString := json.Unmarshal(rawModel, &model) == nil && len(rawModel) > 0 && rawModel[0] == '"'
			if err != nil {
				var be *requestbody.Error
				if !errors.As(err, &be) {
					t.Fatalf("non-body error %v", err)
				}
				if modelIsString && model != "" && !strings.Contains(err.Error(), "messages") && !strings.Contains(err.Error(), "nesting") && !strings.Contains(err.Error(), "escape") && !strings.Contains(err.Error(), "UTF-8") {
					t.Fatalf("rejected valid body %q with model %q: %v", body, model, err)
				}
				continue
			}
			if !modelIsString || rb.Model != model {
				t.Fatalf("model %q, encoding/json says %s", rb.Model, rawModel)
			}
			// The prompt is the raw value as sent (encoding/json, like the
			// parser, keeps the last of duplicate keys); checkSkimmed holds
			// a cut prompt to a prefix of it.
			msgs, prompt := string(obj["messages"]), string(obj["prompt"])
			switch got := string(rb.Prompt); {
			case kind == requestbody.Chat && got != msgs, kind == requestbody.Completions && got != prompt, kind == requestbody.NoPath && got != msgs && got != prompt:
				t.Fatalf("prompt %q, want the raw value: messages %q, prompt %q", got, msgs, prompt)
			}
			out := rb.RewriteModel(body, "rewritten")
			var after map[string]json.RawMessage
			if json.Unmarshal(out, &after) != nil || string(after["model"]) != `"rewritten"` || len(after) != len(obj) {
				t.Fatalf("rewrite broke the body: %q", out)
			}
		}
	})
}

// checkSkimmed holds a parse with a prompt limit (which skims what it does
// not read) to the fully validating one (full, fullErr; nil when there is
// none) and to encoding/json: it accepts whatever the full parse accepts,
// with the same model, stream and prompt prefix; it rejects only what the
// full parse rejects; and when it accepts a body encoding/json rejects, the
// defect lies in bytes it skimmed, and its model is still the model value.
func checkSkimmed(t *testing.T, body []byte, kind requestbody.Kind, limit int, full *requestbody.Request, fullErr error) {
	t.Helper()
	cut, skimmed, err := requestbody.ParseSkimming(body, kind, limit)
	if full != nil || fullErr != nil {
		if fullErr == nil {
			if err != nil {
				t.Fatalf("limit %d: rejected what the full parse accepts: %v", limit, err)
			}
			// Cut exactly at the limit: a prefix of the full prompt.
			if want := full.Prompt[:min(len(full.Prompt), limit)]; string(cut.Prompt) != string(want) || cut.Model != full.Model || cut.Stream != full.Stream {
				t.Fatalf("limit %d: prompt %q model %q stream %v, want %q %q %v", limit, cut.Prompt, cut.Model, cut.Stream, want, full.Model, full.Stream)
			}
		} else if err != nil && !kind.Strict() {
			t.Fatalf("limit %d: lenient parse failed: %v", limit, err)
		}
	}
	if err != nil {
		var be *requestbody.Error
		if !errors.As(err, &be) || errors.Is(err, requestbody.ErrPromptFull) {
			t.Fatalf("limit %d: error %v is not a 400", limit, err)
		}
		return
	}
	if cut.HasModel() {
		var m string
		if raw := body[cut.ModelStart:cut.ModelEnd]; json.Unmarshal(raw, &m) != nil || m != cut.Model {
			t.Fatalf("limit %d: model %q, but its range holds %s", limit, cut.Model, raw)
		}
	}
	var obj map[string]json.RawMessage
	jerr := json.Unmarshal(body, &obj)
	if jerr == nil {
		if cut.HasModel() {
			var m string
			if json.Unmarshal(obj["model"], &m) != nil || m != cut.Model {
				t.Fatalf("limit %d: model %q, encoding/json says %s", limit, cut.Model, obj["model"])
			}
		}
		return
	}
	var se *json.SyntaxError
	if !errors.As(jerr, &se) {
		if kind.Strict() {
			t.Fatalf("limit %d: accepted %q, which encoding/json rejects: %v", limit, body, jerr)
		}
		return
	}
	// encoding/json stops after reading Offset bytes: the last of them is
	// the bad one.
	bad := int(se.Offset) - 1
	for _, s := range skimmed {
		if s[0] <= bad && bad < s[1] {
			return
		}
	}
	if kind.Strict() {
		t.Fatalf("limit %d: accepted %q; encoding/json: %v at offset %d, outside the skimmed %v", limit, body, jerr, bad, skimmed)
	}
}

// FuzzScannerPieces holds the scanner fed a body in pieces (cut where the
// fuzzer says, as gateways cut bodies anywhere) to the scanner fed the
// whole body at once: the same result or the same error, and a defect
// reported by an early piece is the whole body's defect.
func FuzzScannerPieces(f *testing.F) {
	for i, s := range seeds {
		f.Add([]byte(s), []byte{byte(i), 1, 3, 7, 2})
		f.Add([]byte(s), []byte{1})
	}
	f.Add(requestbodytest.ChatBody(4<<10, false), []byte{200, 13, 255, 64})
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		for _, kind := range kinds {
			for _, limit := range []int{0, 7, 64, math.MaxInt} {
				want, wantErr := requestbody.Parse(body, kind, limit)
				sc := requestbody.NewScanner(kind, limit)
				end, k := 0, 0
				var early error
				for end < len(body) {
					step := 1
					if len(cuts) > 0 {
						step = int(cuts[k%len(cuts)])%max(len(body)/2, 1) + 1
						k++
					}
					end = min(end+step, len(body))
					// The piece is copied to a buffer of its own, as it
					// is joined in the stream: earlier bytes stay put.
					if err := sc.Feed(append([]byte(nil), body[:end]...), false); err != nil && early == nil {
						early = err
					}
				}
				_ = sc.Feed(body, true)
				got, gotErr := sc.Result(body)
				if early != nil {
					if whole := requestbody.NewScanner(kind, limit).Feed(body, true); whole == nil || early.Error() != whole.Error() {
						t.Fatalf("kind %v limit %d: a piece reported %v, the whole body %v", kind, limit, early, whole)
					}
				}
				if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
					t.Fatalf("kind %v limit %d: in pieces %v, at once %v (body %q)", kind, limit, gotErr, wantErr, body)
				}
				if gotErr != nil {
					continue
				}
				if got.Model != want.Model || got.ModelStart != want.ModelStart || got.ModelEnd != want.ModelEnd ||
					got.Stream != want.Stream || string(got.Prompt) != string(want.Prompt) || (got.Prompt == nil) != (want.Prompt == nil) {
					t.Fatalf("kind %v limit %d: in pieces %+v, at once %+v (body %q)", kind, limit, got, want, body)
				}
			}
		}
	})
}
