package extproc

import (
	"encoding/json"
	"errors"
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
			rb, err := parseRequestBody([]byte(c.body), c.kind)
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
	rb, err := parseRequestBody(body, pathCompletions)
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
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, kind := range []pathKind{pathCompletions, pathChat, pathNone, pathUnknown} {
			rb, err := parseRequestBody(body, kind)
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
