package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestParseRequestBody(t *testing.T) {
	cases := []struct {
		name       string
		kind       pathKind
		body       string
		model      string
		prompt     string
		stream     bool
		wantErr    string
		emptyModel bool
	}{
		{name: "completion", kind: pathCompletions, body: `{"model":"m","prompt":"hi there","stream":true}`, model: "m", prompt: `"hi there"`, stream: true},
		{name: "completion array prompt", kind: pathCompletions, body: `{"prompt":["a","b"],"model":"m"}`, model: "m", prompt: `["a","b"]`},
		{name: "token prompt", kind: pathCompletions, body: `{"prompt":[1, 2,3],"model":"m"}`, model: "m", prompt: "[1, 2,3]"},
		{name: "escapes kept", kind: pathCompletions, body: `{"model":"m\u00e9","prompt":"a\nb\"c\ud83d\ude00"}`, model: "mé", prompt: `"a\nb\"c\ud83d\ude00"`},
		{name: "chat", kind: pathChat, body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			model: "m", prompt: `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]`},
		{name: "chat ignores prompt field", kind: pathChat, body: `{"model":"m","prompt":"no","messages":[ ]}`, model: "m", prompt: "[ ]"},
		{name: "completion ignores messages field", kind: pathCompletions, body: `{"model":"m","prompt":"p","messages":[]}`, model: "m", prompt: `"p"`},
		{name: "duplicate model: last wins", kind: pathCompletions, body: `{"model":"a","model":"b"}`, model: "b"},
		{name: "escaped key", kind: pathCompletions, body: `{"mo\u0064el":"m"}`, model: "m"},
		{name: "embeddings", kind: pathModelOnly, body: `{"model":"e","input":"x"}`, model: "e"},
		{name: "ngf no path", kind: pathNone, body: `{"model":"m","messages":[{"role":"user","content":"q"}]}`, model: "m", prompt: `[{"role":"user","content":"q"}]`},
		{name: "unknown path not json", kind: pathUnknown, body: `--boundary`, emptyModel: true},
		{name: "unknown path model", kind: pathUnknown, body: `{"model":"m"}`, model: "m"},
		{name: "bad json", kind: pathCompletions, body: `{"model":"m"`, wantErr: "unexpected end"},
		{name: "trailing data", kind: pathCompletions, body: `{"model":"m"} x`, wantErr: "after the top-level"},
		{name: "array", kind: pathChat, body: `[]`, wantErr: "not a JSON object"},
		{name: "empty", kind: pathChat, body: ``, wantErr: "empty"},
		{name: "missing model", kind: pathChat, body: `{"messages":[]}`, wantErr: `no "model"`},
		{name: "empty model", kind: pathChat, body: `{"model":""}`, wantErr: `"model" is empty`},
		{name: "model number", kind: pathChat, body: `{"model":1}`, wantErr: "must be a string"},
		{name: "message not an object", kind: pathChat, body: `{"model":"m","messages":[{"role":"u"},"x"]}`, wantErr: `each of "messages" must be an object`},
		{name: "bad escape in prompt", kind: pathCompletions, body: `{"model":"m","prompt":"a\q"}`, wantErr: "bad escape"},
		{name: "messages not array", kind: pathChat, body: `{"model":"m","messages":{}}`, wantErr: "must be an array"},
		{name: "bad number", kind: pathChat, body: `{"model":"m","n":01}`, wantErr: "invalid JSON"},
		{name: "control char", kind: pathChat, body: "{\"model\":\"m\x01\"}", wantErr: "control character"},
		{name: "deep nesting", kind: pathChat, body: `{"model":"m","x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, wantErr: "nesting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rb, err := parseRequestBody([]byte(c.body), c.kind, math.MaxInt)
			if c.wantErr != "" {
				var be *bodyError
				if err == nil || !errors.As(err, &be) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want a body error containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rb.Model != c.model || string(rb.Prompt) != c.prompt || rb.Stream != c.stream {
				t.Fatalf("got model %q prompt %q stream %v", rb.Model, rb.Prompt, rb.Stream)
			}
		})
	}
}

// TestPromptPrefixSharing: the prompt is the raw JSON of the messages (or
// prompt value), so requests that extend a conversation, serialized the
// same way, share every byte up to where they differ; other top-level
// fields do not matter, and a different serialization is a different prompt.
func TestPromptPrefixSharing(t *testing.T) {
	sys := `{"role":"system","content":"You are a helpful assistant.\n"}`
	u1 := `{"role":"user","content":"What is \"KV cache\"?"}`
	a1 := `{"role":"assistant","content":"A cache of attention keys and values."}`
	u2 := `{"role":"user","content":"How big is it?"}`
	cases := []struct {
		name         string
		kind         pathKind
		first, other string
		common       int // bytes both prompts share from the start
	}{
		{"chat turn 2 extends turn 1", pathChat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"stream":true,"messages":[` + sys + `,` + u1 + `,` + a1 + `,` + u2 + `],"model":"m","max_tokens":9}`,
			len(`[` + sys + `,` + u1)},
		{"chat same system prompt", pathChat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"model":"m","messages":[` + sys + `,` + u2 + `]}`,
			len(`[` + sys + `,{"role":"user","content":"`)},
		{"chat other key order differs at that message", pathChat,
			`{"model":"m","messages":[` + sys + `,` + u1 + `]}`,
			`{"model":"m","messages":[` + sys + `,{"content":"What is \"KV cache\"?","role":"user"}]}`,
			len(`[` + sys + `,{"`)},
		{"completion and its extension", pathCompletions,
			`{"model":"m","prompt":"Once upon a time"}`,
			`{"model":"m","prompt":"Once upon a time, there was","temperature":0}`,
			len(`"Once upon a time`)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := parseRequestBody([]byte(c.first), c.kind, math.MaxInt)
			if err != nil {
				t.Fatal(err)
			}
			b, err := parseRequestBody([]byte(c.other), c.kind, math.MaxInt)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for n < min(len(a.Prompt), len(b.Prompt)) && a.Prompt[n] == b.Prompt[n] {
				n++
			}
			if n != c.common {
				t.Fatalf("prompts %q and %q share %d bytes, want %d", a.Prompt, b.Prompt, n, c.common)
			}
		})
	}
}

func TestRewriteModel(t *testing.T) {
	body := []byte(`{ "z": {"model":"x"}, "model" : "old", "unknown": [1, {"a": "b"}] }`)
	rb, err := parseRequestBody(body, pathCompletions, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	got := rewriteModel(body, rb, `new"one`)
	want := `{ "z": {"model":"x"}, "model" : "new\"one", "unknown": [1, {"a": "b"}] }`
	if string(got) != want {
		t.Fatalf("got %s", got)
	}
}

// bodySeeds are bodies that reach every branch of the scanner.
var bodySeeds = []string{
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

// FuzzParseRequestBody holds the hand-written scanner equal to
// encoding/json on validity and on the model it extracts.
func FuzzParseRequestBody(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Paths without a prompt skim all but model and stream at any limit.
		checkSkimmed(t, body, pathModelOnly, 0, nil, nil)
		for _, kind := range []pathKind{pathCompletions, pathChat, pathNone, pathUnknown} {
			// Without a limit the prompt is never full, so nothing is
			// skimmed on prompt paths: this is the fully validating parser.
			before := string(body)
			rb, err := parseRequestBody(body, kind, math.MaxInt)
			if string(body) != before {
				t.Fatalf("parsing changed the body (which is forwarded): %q, was %q", body, before)
			}
			if err == nil && kind != pathUnknown && len(rb.skimmed) != 0 {
				t.Fatalf("skimmed %v without a limit", rb.skimmed)
			}
			for _, limit := range []int{0, 1, 7, 64} {
				checkSkimmed(t, body, kind, limit, rb, err)
			}
			var ref struct {
				Model json.RawMessage `json:"model"`
			}
			refErr := json.Unmarshal(body, &ref)
			var isObj map[string]json.RawMessage
			objErr := json.Unmarshal(body, &isObj)
			if !kind.strict() {
				if err != nil {
					t.Fatalf("lenient parse failed: %v", err)
				}
				continue
			}
			if refErr != nil || objErr != nil {
				if err == nil {
					t.Fatalf("accepted invalid JSON %q (encoding/json: %v)", body, refErr)
				}
				continue
			}
			// The map keeps keys as written (the struct would also take
			// "modeL"; the parser, like model servers, wants "model").
			ref.Model = isObj["model"]
			var model string
			modelIsString := json.Unmarshal(ref.Model, &model) == nil && len(ref.Model) > 0 && ref.Model[0] == '"'
			if err != nil {
				var be *bodyError
				if !errors.As(err, &be) {
					t.Fatalf("non-body error %v", err)
				}
				if modelIsString && model != "" && !strings.Contains(err.Error(), "messages") && !strings.Contains(err.Error(), "nesting") && !strings.Contains(err.Error(), "escape") && !strings.Contains(err.Error(), "UTF-8") {
					t.Fatalf("rejected valid body %q with model %q: %v", body, model, err)
				}
				continue
			}
			if !modelIsString || rb.Model != model {
				t.Fatalf("model %q, encoding/json says %s", rb.Model, ref.Model)
			}
			// The prompt is the raw value as sent (encoding/json, like the
			// parser, keeps the last of duplicate keys); checkSkimmed holds
			// a cut prompt to a prefix of it.
			msgs, prompt := string(isObj["messages"]), string(isObj["prompt"])
			switch got := string(rb.Prompt); {
			case kind == pathChat && got != msgs, kind == pathCompletions && got != prompt, kind == pathNone && got != msgs && got != prompt:
				t.Fatalf("prompt %q, want the raw value: messages %q, prompt %q", got, msgs, prompt)
			}
			out := rewriteModel(body, rb, "rewritten")
			var after map[string]json.RawMessage
			if json.Unmarshal(out, &after) != nil || string(after["model"]) != `"rewritten"` || len(after) != len(isObj) {
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
func checkSkimmed(t *testing.T, body []byte, kind pathKind, limit int, full *requestBody, fullErr error) {
	t.Helper()
	cut, err := parseRequestBody(body, kind, limit)
	if full != nil || fullErr != nil {
		if fullErr == nil {
			if err != nil {
				t.Fatalf("limit %d: rejected what the full parse accepts: %v", limit, err)
			}
			// Cut exactly at the limit: a prefix of the full prompt.
			if want := full.Prompt[:min(len(full.Prompt), limit)]; string(cut.Prompt) != string(want) || cut.Model != full.Model || cut.Stream != full.Stream {
				t.Fatalf("limit %d: prompt %q model %q stream %v, want %q %q %v", limit, cut.Prompt, cut.Model, cut.Stream, want, full.Model, full.Stream)
			}
		} else if err != nil && !kind.strict() {
			t.Fatalf("limit %d: lenient parse failed: %v", limit, err)
		}
	}
	if err != nil {
		var be *bodyError
		if !errors.As(err, &be) || err == errPromptFull {
			t.Fatalf("limit %d: error %v is not a 400", limit, err)
		}
		return
	}
	if cut.hasModel {
		raw := body[cut.modelStart:cut.modelEnd]
		if m, err := unquote(raw); err != nil || m != cut.Model {
			t.Fatalf("limit %d: model %q, but its range holds %s", limit, cut.Model, raw)
		}
	}
	var obj map[string]json.RawMessage
	jerr := json.Unmarshal(body, &obj)
	if jerr == nil {
		if cut.hasModel {
			var m string
			if json.Unmarshal(obj["model"], &m) != nil || m != cut.Model {
				t.Fatalf("limit %d: model %q, encoding/json says %s", limit, cut.Model, obj["model"])
			}
		}
		return
	}
	var se *json.SyntaxError
	if !errors.As(jerr, &se) {
		if kind.strict() {
			t.Fatalf("limit %d: accepted %q, which encoding/json rejects: %v", limit, body, jerr)
		}
		return
	}
	// encoding/json stops after reading Offset bytes: the last of them is
	// the bad one.
	bad := int(se.Offset) - 1
	for _, s := range cut.skimmed {
		if s.start <= bad && bad < s.end {
			return
		}
	}
	if kind.strict() {
		t.Fatalf("limit %d: accepted %q; encoding/json: %v at offset %d, outside the skimmed %v", limit, body, jerr, bad, cut.skimmed)
	}
}

// benchBody is a chat request of size bytes whose user content is words
// with a JSON escape every few words (newlines, quotes), as real prompts
// have, or plain words when plain is set.
func benchBody(size int, plain bool) []byte {
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

func BenchmarkParseRequestBody(b *testing.B) {
	for _, c := range []struct {
		name  string
		size  int
		plain bool
		limit int
	}{
		{"chat-1KiB", 1 << 10, false, math.MaxInt}, {"chat-64KiB", 64 << 10, false, math.MaxInt}, {"chat-64KiB-plain", 64 << 10, true, math.MaxInt},
		// The default scheduler reads 256 blocks of 64 bytes.
		{"chat-64KiB-limit-16KiB", 64 << 10, false, 16 << 10}, {"chat-64KiB-plain-limit-16KiB", 64 << 10, true, 16 << 10},
	} {
		body := benchBody(c.size, c.plain)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseRequestBody(body, pathChat, c.limit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestParseRequestBodySkim covers what happens past the prompt limit: the
// rest of the prompt and every other value except model and stream are only
// skimmed to find where they end, so every top-level key is still found,
// and only a truncation there is an error.
func TestParseRequestBodySkim(t *testing.T) {
	long := strings.Repeat("0123456789", 10)
	huge := `[` + strings.Repeat(`{"role":"user","content":"`+long+`\"\\\"\\ ]} \n"},`, 10000) + `{"role":"a","content":"end"}]`
	cases := []struct {
		name, body string
		kind       pathKind
		limit      int
		model      string
		prompt     string
		stream     bool
		wantErr    string
	}{
		{name: "escaped quotes and backslashes", kind: pathChat, limit: 5, model: "m", prompt: `[{"ro`, stream: true,
			body: `{"messages":[{"role":"u","content":"` + long + `\\\"\\\\\"\\"},{"role":"a","content":"\"],\"model\":\"no\"}"}],"model":"m","stream":true}`},
		{name: "backslashes right before the limit", kind: pathCompletions, limit: 3, model: "m", prompt: `"a\`,
			body: `{"prompt":"a\\\\\\\"","model":"m"}`},
		{name: "nested arrays and brackets in strings", kind: pathChat, limit: 5, model: "m", prompt: `[{"ro`, stream: true,
			body: `{"model":"x","messages":[{"role":"u","content":"` + long + `"}],"tools":[[1,[2,{"a":"]}"}]],{"b":["}",[[]]]}],"model":"m","stream":true}`},
		{name: "model after a huge messages array", kind: pathChat, limit: 16 << 10, model: "m", stream: true,
			body: `{"messages":` + huge + `,"stream":true,"model":"m"}`},
		{name: "limit 0 skims the whole prompt", kind: pathChat, limit: 0, model: "m",
			body: `{"messages":[{"role":"u","content":"\q"},7,[}],"model":"m"}`},
		{name: "embeddings skim the input", kind: pathModelOnly, limit: 16 << 10, model: "e",
			body: `{"input":["\q",01,{]],"model":"e"}`},
		// Defects in skimmed bytes: forwarded, the model server rejects them.
		{name: "bad escape skimmed", kind: pathCompletions, limit: 5, model: "m", prompt: `"0123`, body: `{"prompt":"` + long + `\x\u12","model":"m"}`},
		{name: "control byte skimmed", kind: pathChat, limit: 5, model: "m", prompt: `[{"ro`, body: "{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"" + long + "\x01\"}]}"},
		{name: "bad number in skimmed value", kind: pathChat, limit: 5, model: "m", prompt: `[{"ro`, body: `{"messages":[{"role":"u","content":"` + long + `"}],"logit_bias":{"1":01},"model":"m"}`},
		// Still 400s.
		{name: "truncated skimmed string", kind: pathChat, limit: 5, wantErr: "unexpected end", body: `{"model":"m","messages":[{"role":"u","content":"` + long + `\"`},
		{name: "truncated skimmed array", kind: pathChat, limit: 5, wantErr: "unexpected end", body: `{"model":"m","messages":[{"role":"u","content":"` + long + `"},[{"a":"]"}`},
		{name: "truncated skimmed value", kind: pathChat, limit: 5, wantErr: "unexpected end", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m","tools":{"a":[`},
		{name: "truncated after the skimmed value", kind: pathChat, limit: 5, wantErr: "unexpected end", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m"`},
		{name: "not an object", kind: pathChat, limit: 0, wantErr: "not a JSON object", body: `["model","m"]`},
		{name: "missing model after skimming", kind: pathChat, limit: 5, wantErr: `no "model"`, body: `{"messages":[{"role":"u","content":"` + long + `"}],"tools":{"model":"m"}}`},
		{name: "model not a string after skimming", kind: pathChat, limit: 5, wantErr: "must be a string", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":["m"]}`},
		{name: "model still validated after skimming", kind: pathChat, limit: 5, wantErr: "bad escape", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m\q"}`},
		{name: "stream still validated after skimming", kind: pathChat, limit: 5, wantErr: "want true", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m","stream":tru}`},
		{name: "top level still validated after skimming", kind: pathChat, limit: 5, wantErr: "want ':'", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model" "m"}`},
		{name: "trailing data after skimming", kind: pathChat, limit: 5, wantErr: "after the top-level", body: `{"messages":[{"role":"u","content":"` + long + `"}],"model":"m"}]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			rb, err := parseRequestBody(body, c.kind, c.limit)
			if c.wantErr != "" {
				var be *bodyError
				if err == nil || !errors.As(err, &be) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want a body error containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantPrompt := c.prompt
			if c.limit == 16<<10 && c.kind == pathChat {
				// The prompt is the first 16 KiB of the messages' JSON.
				wantPrompt = huge[:c.limit]
			}
			if rb.Model != c.model || string(rb.Prompt) != wantPrompt || rb.Stream != c.stream {
				t.Fatalf("got model %q prompt %q stream %v", rb.Model, rb.Prompt, rb.Stream)
			}
			if len(rb.skimmed) == 0 {
				t.Fatal("nothing skimmed")
			}
			// A rewrite replaces exactly the model value, wherever it is.
			out := rewriteModel(body, rb, "new")
			want := string(body[:rb.modelStart]) + `"new"` + string(body[rb.modelEnd:])
			if string(out) != want || string(body[rb.modelStart:rb.modelEnd]) != `"`+c.model+`"` {
				t.Fatalf("rewrite replaced %q", body[rb.modelStart:rb.modelEnd])
			}
			if json.Valid(body) {
				var after struct{ Model string }
				if err := json.Unmarshal(out, &after); err != nil || after.Model != "new" {
					t.Fatalf("rewritten body: model %q, err %v", after.Model, err)
				}
			}
		})
	}
}

// TestParseRequestBodyPromptLimit: the prompt is the raw value cut exactly
// at the limit, a slice of the body (no copy), and what lies past the limit
// is skimmed.
func TestParseRequestBodyPromptLimit(t *testing.T) {
	long := strings.Repeat("0123456789", 10) // 100 bytes
	cases := []struct {
		name    string
		kind    pathKind
		value   string // the messages or prompt value
		tail    string // the body after the value; "}" unless set
		limit   int
		wantErr string
	}{
		{name: "chat cut in content", kind: pathChat, value: `[{"role":"user","content":"` + long + `"}]`, limit: 40},
		{name: "chat cut in a key", kind: pathChat, value: `[{"role":"user","content":"` + long + `"}]`, limit: 5},
		{name: "chat cut in a later message", kind: pathChat, value: `[{"role":"a","content":"xy"},{"role":"b","content":"` + long + `"}]`, limit: 40},
		{name: "chat cut between messages", kind: pathChat, value: `[{"role":"a","content":"xy"} , {"role":"b","content":"` + long + `"}]`, limit: 29},
		{name: "chat cut at an escape", kind: pathChat, value: `[{"role":"u","content":"ab\n\u00e9` + long + `"}]`, limit: 29},
		{name: "chat under the limit: whole", kind: pathChat, value: `[{"role":"u","content":"short"}]`, limit: 1000},
		{name: "completion cut", kind: pathCompletions, value: `"` + long + `"`, limit: 15},
		{name: "completion cut in an escape", kind: pathCompletions, value: `"ab\u00e9` + long + `"`, limit: 6},
		{name: "completion array cut", kind: pathCompletions, value: `["abc","` + long + `"]`, limit: 9},
		{name: "token array cut", kind: pathCompletions, value: `[101, 2023, 2003, 1037]`, limit: 8},
		{name: "zero: empty", kind: pathCompletions, value: `"` + long + `"`, limit: 0},
		{name: "completion under the limit: whole", kind: pathCompletions, value: `"short"`, limit: 100},
		{name: "limit one past the value", kind: pathCompletions, value: `"short"`, limit: 8},
		// The part past the limit is only skimmed: a defect there is the
		// model server's to reject, a truncation is still a 400.
		{name: "bad escape past the limit", kind: pathCompletions, value: `"` + long + `\x"`, limit: 5},
		{name: "control byte past the limit", kind: pathChat, value: "[{\"role\":\"u\",\"content\":\"" + long + "\x01\"}]", limit: 5},
		{name: "bad message past the limit", kind: pathChat, value: `[{"role":"u","content":"` + long + `"},3]`, limit: 40},
		{name: "bad message before the limit", kind: pathChat, value: `[{"role":"u","content":"x"},3]`, limit: 40, wantErr: "must be an object"},
		{name: "bad escape before the limit", kind: pathChat, value: `[{"role":"u","content":"x\q` + long + `"}]`, limit: 40, wantErr: "bad escape"},
		{name: "unterminated past the limit", kind: pathChat, value: `[{"role":"u","content":"` + long, tail: " ", limit: 5, wantErr: "closing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := `{"model":"m","messages":`
			if c.kind == pathCompletions {
				key = `{"model":"m","prompt":`
			}
			tail := c.tail
			if tail == "" {
				tail = "}"
			}
			body := []byte(key + c.value + tail)
			rb, err := parseRequestBody(body, c.kind, c.limit)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := c.value[:min(c.limit, len(c.value))]; string(rb.Prompt) != want || rb.Model != "m" {
				t.Fatalf("prompt %q model %q, want %q", rb.Prompt, rb.Model, want)
			}
			// Zero-copy: the prompt is the body's bytes, and cannot be
			// appended to in place.
			if len(rb.Prompt) > 0 && &rb.Prompt[0] != &body[len(key)] {
				t.Fatal("the prompt is a copy, not a slice of the body")
			}
			if cap(rb.Prompt) != len(rb.Prompt) {
				t.Fatalf("prompt cap %d > len %d: an append would write into the body", cap(rb.Prompt), len(rb.Prompt))
			}
		})
	}
}

// FuzzBodyScannerPieces holds the scanner fed a body in pieces (cut where
// the fuzzer says, as gateways cut bodies anywhere) to the scanner fed the
// whole body at once: the same result or the same error, and a defect
// reported by an early piece is the whole body's defect.
func FuzzBodyScannerPieces(f *testing.F) {
	for i, s := range bodySeeds {
		f.Add([]byte(s), []byte{byte(i), 1, 3, 7, 2})
		f.Add([]byte(s), []byte{1})
	}
	f.Add(benchBody(4<<10, false), []byte{200, 13, 255, 64})
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		for _, kind := range []pathKind{pathCompletions, pathChat, pathNone, pathUnknown, pathModelOnly} {
			for _, limit := range []int{0, 7, 64, math.MaxInt} {
				want, wantErr := parseRequestBody(body, kind, limit)
				sc := newBodyScanner(kind, limit)
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
					if err := sc.feed(append([]byte(nil), body[:end]...), false); err != nil && early == nil {
						early = err
					}
				}
				_ = sc.feed(body, true)
				got, gotErr := sc.result(body)
				if early != nil {
					if whole := newBodyScanner(kind, limit).feed(body, true); whole == nil || early.Error() != whole.Error() {
						t.Fatalf("kind %d limit %d: a piece reported %v, the whole body %v", kind, limit, early, whole)
					}
				}
				if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
					t.Fatalf("kind %d limit %d: in pieces %v, at once %v (body %q)", kind, limit, gotErr, wantErr, body)
				}
				if gotErr != nil {
					continue
				}
				if got.Model != want.Model || got.hasModel != want.hasModel || got.modelStart != want.modelStart || got.modelEnd != want.modelEnd ||
					got.Stream != want.Stream || string(got.Prompt) != string(want.Prompt) || (got.Prompt == nil) != (want.Prompt == nil) ||
					len(got.skimmed) != len(want.skimmed) {
					t.Fatalf("kind %d limit %d: in pieces %+v, at once %+v (body %q)", kind, limit, got, want, body)
				}
				for i := range got.skimmed {
					if got.skimmed[i] != want.skimmed[i] {
						t.Fatalf("kind %d limit %d: skimmed %v in pieces, %v at once", kind, limit, got.skimmed, want.skimmed)
					}
				}
			}
		}
	})
}

// TestExactSpecialMask compares the SWAR mask with a byte-by-byte test on
// every byte value in every position, among other bytes that are special
// or not, and on random words.
func TestExactSpecialMask(t *testing.T) {
	special := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	check := func(w uint64) {
		t.Helper()
		var want uint64
		for k := 0; k < 8; k++ {
			if special(byte(w >> (8 * k))) {
				want |= 0x80 << (8 * k)
			}
		}
		if got := exactSpecialMask(w); got != want {
			t.Fatalf("word %016x: mask %016x, want %016x", w, got, want)
		}
	}
	for _, fill := range []byte{'a', 0, '"', '\\', 0x1f, 0x20, 0x7f, 0x80, 0xff} {
		for p := 0; p < 8; p++ {
			for v := 0; v < 256; v++ {
				w := lsb * uint64(fill)
				w = w&^(0xff<<(8*p)) | uint64(v)<<(8*p)
				check(w)
			}
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(rnd.Uint64())
	}
}

// TestValidRun checks where a run of plain bytes and two-byte escapes ends,
// with escapes across the eight-byte words it tests.
func TestValidRun(t *testing.T) {
	cases := []struct {
		s    string
		lim  int // -1: len(s)
		want int
	}{
		{`abcdefghijklmnop"`, -1, 16},
		{`abcdefg\"hijklmn"`, -1, 16},             // escape across words
		{`abcdef\\"`, -1, 8},                      // an escaped backslash, then the end
		{`\n\t\"\\\/\b\f\rxyz"`, -1, 19},          // every two-byte escape
		{`abcdefgh\u0041"`, -1, 8},                // \u is for the caller
		{`abcdefgh\x"`, -1, 8},                    // a bad escape too
		{`abcdefg\`, -1, 7},                       // cut after the backslash
		{"abc\x01def", -1, 3},                     // a control byte
		{`abcdefghijklmnop`, -1, 16},              // runs out
		{`abcdefghijklmnop`, 5, 5},                // stops at lim
		{`abcd\nefghijklmnop`, 5, 6},              // an escape across lim ends past it
		{`abcdefghijklmnopqrstuvw\"xyz"`, 24, 25}, // the same in the word loop
	}
	for _, c := range cases {
		lim := c.lim
		if lim < 0 {
			lim = len(c.s)
		}
		if got := validRun([]byte(c.s), 0, lim); got != c.want {
			t.Errorf("validRun(%q, lim %d) = %d, want %d", c.s, lim, got, c.want)
		}
	}
}

// TestSkimStringAgainstIndexByte holds skimString, which tests words in
// place before handing long hops to bytes.IndexByte, to the plain loop over
// IndexByte it replaced, on random strings dense in quotes and backslashes,
// whole and cut short.
func TestSkimStringAgainstIndexByte(t *testing.T) {
	reference := func(b []byte, i int) (int, bool) {
		from := i
		for {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				r := len(b)
				for r > from && b[r-1] == '\\' {
					r--
				}
				return r, false
			}
			q := i + k
			p := q
			for p > from && b[p-1] == '\\' {
				p--
			}
			if (q-p)%2 == 0 {
				return q + 1, true
			}
			i = q + 1
		}
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte(`"\\ab`)
	for n := 0; n < 200000; n++ {
		b := make([]byte, rnd.IntN(300))
		density := 2 + rnd.IntN(200) // one special byte in about density
		for i := range b {
			if rnd.IntN(density) == 0 {
				b[i] = alphabet[rnd.IntN(2)]
			} else {
				b[i] = alphabet[2+rnd.IntN(2)]
			}
		}
		start := 0
		if len(b) > 0 {
			start = rnd.IntN(len(b))
			for start > 0 && b[start-1] == '\\' { // not inside an escape
				start--
			}
		}
		gotEnd, gotClosed := skimString(b, start)
		wantEnd, wantClosed := reference(b, start)
		if gotEnd != wantEnd || gotClosed != wantClosed {
			t.Fatalf("skimString(%q, %d) = %d, %v; want %d, %v", b, start, gotEnd, gotClosed, wantEnd, wantClosed)
		}
	}
}
