package extproc

import (
	"encoding/json"
	"errors"
	"math"
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
		{name: "completion", kind: pathCompletions, body: `{"model":"m","prompt":"hi there","stream":true}`, model: "m", prompt: "hi there", stream: true},
		{name: "completion array prompt", kind: pathCompletions, body: `{"prompt":["a","b"],"model":"m"}`, model: "m", prompt: "ab"},
		{name: "token prompt kept raw", kind: pathCompletions, body: `{"prompt":[1, 2,3],"model":"m"}`, model: "m", prompt: "123"},
		{name: "escapes", kind: pathCompletions, body: `{"model":"m\u00e9","prompt":"a\nb\"c\ud83d\ude00"}`, model: "mé", prompt: "a\nb\"c😀"},
		{name: "chat", kind: pathChat, body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			model: "m", prompt: "<|system|>be brief\n<|user|>hi{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}\n"},
		{name: "chat ignores prompt field", kind: pathChat, body: `{"model":"m","prompt":"no","messages":[]}`, model: "m", prompt: ""},
		{name: "duplicate model: last wins", kind: pathCompletions, body: `{"model":"a","model":"b"}`, model: "b"},
		{name: "escaped key", kind: pathCompletions, body: `{"mo\u0064el":"m"}`, model: "m"},
		{name: "embeddings", kind: pathModelOnly, body: `{"model":"e","input":"x"}`, model: "e"},
		{name: "ngf no path", kind: pathNone, body: `{"model":"m","messages":[{"role":"user","content":"q"}]}`, model: "m", prompt: "<|user|>q\n"},
		{name: "unknown path not json", kind: pathUnknown, body: `--boundary`, emptyModel: true},
		{name: "unknown path model", kind: pathUnknown, body: `{"model":"m"}`, model: "m"},
		{name: "bad json", kind: pathCompletions, body: `{"model":"m"`, wantErr: "unexpected end"},
		{name: "trailing data", kind: pathCompletions, body: `{"model":"m"} x`, wantErr: "after the top-level"},
		{name: "array", kind: pathChat, body: `[]`, wantErr: "not a JSON object"},
		{name: "empty", kind: pathChat, body: ``, wantErr: "empty"},
		{name: "missing model", kind: pathChat, body: `{"messages":[]}`, wantErr: `no "model"`},
		{name: "empty model", kind: pathChat, body: `{"model":""}`, wantErr: `"model" is empty`},
		{name: "model number", kind: pathChat, body: `{"model":1}`, wantErr: "must be a string"},
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

// FuzzParseRequestBody holds the hand-written scanner equal to
// encoding/json on validity and on the model it extracts.
func FuzzParseRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"p"}`, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"t"}]}]}`,
		`{"model":"\ud800"}`, `{"model":"a\/b","x":-1.5e+3,"y":[true,false,null]}`, `{`, `{"a":1,}`, `[1]`, `"x"`, `{"model":"m"}}`,
		`{"model":"m","n":-0.0E-0}`, " \t{\"model\" :\n\"m\" }\r\n",
		`{"model":"m","messages":[{"content":"c first","role":"r"},{"role":"u","content":"a\nb\"c\ud83d\ude00 plain text past sixteen bytes"}]}`,
		`{"model":"m","prompt":"0123456789abcdef0123\t\u00e9x"}`, `{"model":"m","prompt":["ab\n","cd"]}`,
		`{"model":"m","messages":[{"role":"u","content":"x","content":"y"}]}`, `{"model":"m","prompt":"a\u12"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, kind := range []pathKind{pathCompletions, pathChat, pathNone, pathUnknown} {
			rb, err := parseRequestBody(body, kind, math.MaxInt)
			// A prompt limit cuts the prompt and changes nothing else.
			for _, limit := range []int{0, 1, 7, 64} {
				cut, cerr := parseRequestBody(body, kind, limit)
				if (cerr == nil) != (err == nil) || (err != nil && cerr.Error() != err.Error()) {
					t.Fatalf("limit %d: err %v, unlimited err %v", limit, cerr, err)
				}
				if err == nil {
					if want := rb.Prompt[:min(len(rb.Prompt), limit)]; string(cut.Prompt) != string(want) || cut.Model != rb.Model || cut.Stream != rb.Stream {
						t.Fatalf("limit %d: prompt %q model %q, want %q %q", limit, cut.Prompt, cut.Model, want, rb.Model)
					}
				}
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
			out := rewriteModel(body, rb, "rewritten")
			var after map[string]json.RawMessage
			if json.Unmarshal(out, &after) != nil || string(after["model"]) != `"rewritten"` || len(after) != len(isObj) {
				t.Fatalf("rewrite broke the body: %q", out)
			}
		}
	})
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
		{"chat-64KiB-limit-16KiB", 64 << 10, false, 16 << 10},
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

func TestParseRequestBodyPromptLimit(t *testing.T) {
	long := strings.Repeat("0123456789", 10) // 100 bytes
	cases := []struct {
		name, body string
		kind       pathKind
		limit      int
		prompt     string
		wantErr    string
	}{
		{"chat cut in content", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, pathChat, 20, "<|user|>012345678901", ""},
		{"chat cut in a later message", `{"model":"m","messages":[{"role":"a","content":"xy"},{"role":"b","content":"` + long + `"}]}`, pathChat, 12, "<|a|>xy\n<|b|", ""},
		{"chat cut at an escape", `{"model":"m","messages":[{"role":"u","content":"ab\n\u00e9` + long + `"}]}`, pathChat, 9, "<|u|>ab\n\xc3", ""},
		{"completion cut", `{"model":"m","prompt":"` + long + `"}`, pathCompletions, 15, long[:15], ""},
		{"completion array cut", `{"model":"m","prompt":["abc","` + long + `"]}`, pathCompletions, 5, "abc01", ""},
		{"zero renders nothing", `{"model":"m","prompt":"` + long + `"}`, pathCompletions, 0, "", ""},
		{"under the limit: whole", `{"model":"m","prompt":"short"}`, pathCompletions, 100, "short", ""},
		// The part past the limit is still validated.
		{"bad escape past the limit", `{"model":"m","prompt":"` + long + `\x"}`, pathCompletions, 5, "", "bad escape"},
		{"control byte past the limit", "{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"" + long + "\x01\"}]}", pathChat, 5, "", "control character"},
		{"unterminated past the limit", `{"model":"m","messages":[{"role":"u","content":"` + long, pathChat, 5, "", "closing"},
		{"bad message past the limit", `{"model":"m","messages":[{"role":"u","content":"` + long + `"},3]}`, pathChat, 5, "", "must be an object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rb, err := parseRequestBody([]byte(c.body), c.kind, c.limit)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(rb.Prompt) != c.prompt || rb.Model != "m" {
				t.Fatalf("prompt %q model %q, want %q", rb.Prompt, rb.Model, c.prompt)
			}
			if cap(rb.Prompt) > 2*max(c.limit, len("short"))+32 {
				t.Fatalf("prompt buffer of %d bytes for a limit of %d: the limit should bound the copy", cap(rb.Prompt), c.limit)
			}
		})
	}
}
