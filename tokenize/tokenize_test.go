// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/poolpicker/poolpicker/internal/modelsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKindOf(t *testing.T) {
	for raw, want := range map[string]Kind{
		`"hi"`: Completion, ` ["a","b"]`: Completion, `[1, 2]`: TokenIDs, `[ {"role":"user"}]`: Chat,
		``: 0, `[]`: 0, `{}`: 0, `12`: 0, `[true]`: 0,
	} {
		if got := KindOf([]byte(raw)); got != want {
			t.Errorf("KindOf(%q) = %d, want %d", raw, got, want)
		}
	}
}

// tokenizeAt is the server's own /tokenize answer for body.
func tokenizeAt(t *testing.T, addr, body string) []uint32 {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Tokens
}

func TestRendererAgainstModelServer(t *testing.T) {
	s, err := modelsim.New(modelsim.Options{Model: "m", Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	// A generous budget: the machine running the test may be loaded.
	r, err := New(Options{Timeout: 10 * time.Second, Client: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tt := range []struct{ name, raw, tokenizeBody string }{
		{"completion", `"a prompt of some length"`, `{"model":"m","prompt":"a prompt of some length"}`},
		{"chat", `[{"role":"user","content":"hello"}]`, `{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := r.Tokens(ctx, "http://"+s.Addr(), "m", []byte(tt.raw))
			if err != nil {
				t.Fatal(err)
			}
			got := res.IDs
			if want := tokenizeAt(t, s.Addr(), tt.tokenizeBody); !slices.Equal(got, want) || len(got) == 0 {
				t.Errorf("render %v, tokenize %v", got, want)
			}
		})
	}
	ids, err := r.Tokens(ctx, "http://unused.invalid", "m", []byte(`[5, 6, 7]`))
	if err != nil || !slices.Equal(ids.IDs, []uint32{5, 6, 7}) {
		t.Errorf("token ids prompt: %v %v", ids, err)
	}
	// A prompt seen before needs no server.
	s.Stop()
	if _, err := r.Tokens(ctx, "http://"+s.Addr(), "m", []byte(`"a prompt of some length"`)); err != nil {
		t.Errorf("cached prompt: %v", err)
	}
	if _, err := r.Tokens(ctx, "http://"+s.Addr(), "m", []byte(`"never seen"`)); err == nil {
		t.Error("a stopped server tokenized a new prompt")
	}
}

func TestRendererBounds(t *testing.T) {
	for _, tt := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"a server slower than the budget", func(w http.ResponseWriter, r *http.Request) {
			// The server notices the client leave once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}, "deadline exceeded"},
		{"an error status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 500) }, "answered 500"},
		{"an answer without token ids", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"x":1}`)) }, "no \"token_ids\""},
		{"an answer too long", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(strings.Repeat(" ", 200))) }, "more than 100 bytes"},
		{"a list answer", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`[{"token_ids":[3]}]`)) }, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			timeout := 10 * time.Second
			if tt.want == "deadline exceeded" {
				timeout = 50 * time.Millisecond
			}
			r, _ := New(Options{Timeout: timeout, MaxResponseBytes: 100, Client: srv.Client()})
			ids, err := r.Tokens(context.Background(), srv.URL, "m", []byte(`"p"`))
			if tt.want == "" {
				if err != nil || !slices.Equal(ids.IDs, []uint32{3}) {
					t.Errorf("got %v %v", ids, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// countingProxy forwards to the model server at addr and counts the render
// requests and the prompt bytes they carry.
type countingProxy struct {
	requests, bytes atomic.Int64
}

func (c *countingProxy) start(t *testing.T, addr string) string {
	t.Helper()
	target, _ := url.Parse("http://" + addr)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		c.bytes.Add(r.ContentLength)
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// words is n bytes of ordinary text, distinct per seed.
func words(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s word%d and ", seed, i)
	}
	return b.String()[:n]
}

func TestRendererLearnsSharedPrefixes(t *testing.T) {
	s, err := modelsim.New(modelsim.Options{Model: "m", Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx := context.Background()
	system := words("system", 6000)
	for _, tt := range []struct {
		name string
		// raw is the JSON prompt of the system text and a question; body
		// the /tokenize request of the same prompt.
		raw, body func(question string) string
	}{
		{"completion",
			func(q string) string { return fmt.Sprintf("%q", system+q) },
			func(q string) string { return fmt.Sprintf(`{"model":"m","prompt":%q}`, system+q) }},
		{"chat",
			func(q string) string {
				return fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":%q}]`, system, q)
			},
			func(q string) string {
				return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q)
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var bytesWith, bytesWithout int64
			for _, prefixes := range []bool{true, false} {
				var c countingProxy
				base := c.start(t, s.Addr())
				opts := Options{Timeout: 10 * time.Second, Client: &http.Client{Transport: tr}}
				if !prefixes {
					opts.PrefixCacheBytes = -1
				}
				r, err := New(opts)
				if err != nil {
					t.Fatal(err)
				}
				const prompts = 10
				for i := range prompts {
					q := words(fmt.Sprintf("question%d", i), 120)
					got, err := r.Tokens(ctx, base, "m", []byte(tt.raw(q)))
					if err != nil {
						t.Fatal(err)
					}
					want := tokenizeAt(t, s.Addr(), tt.body(q))
					switch {
					case !prefixes || i < 2:
						// Two prompts tokenized whole teach the prefix.
						if !got.Whole || !slices.Equal(got.IDs, want) {
							t.Fatalf("prompt %d: whole %v, %d ids, want the %d of the whole prompt", i, got.Whole, len(got.IDs), len(want))
						}
					default:
						if got.Whole || len(got.IDs) > len(want) || !slices.Equal(got.IDs, want[:len(got.IDs)]) {
							t.Fatalf("prompt %d: whole %v, %d ids: not a leading part of the prompt's %d", i, got.Whole, len(got.IDs), len(want))
						}
						// The learned prefix covers the system text but for
						// the token at its end.
						if min := (len(system) - 2*modelsim.BytesPerToken) / modelsim.BytesPerToken; len(got.IDs) < min {
							t.Fatalf("prompt %d: %d ids of the prefix, want at least %d", i, len(got.IDs), min)
						}
					}
				}
				wantRequests := int64(prompts)
				if prefixes {
					wantRequests = 2
					bytesWith = c.bytes.Load()
				} else {
					bytesWithout = c.bytes.Load()
				}
				if n := c.requests.Load(); n != wantRequests {
					t.Errorf("prefix cache %v: %d render requests for %d prompts, want %d", prefixes, n, prompts, wantRequests)
				}
			}
			t.Logf("bytes rendered: %d with the prefix cache, %d without (%.2f)", bytesWith, bytesWithout, float64(bytesWith)/float64(bytesWithout))

			// A prompt sharing less than the least share is rendered whole.
			var c countingProxy
			base := c.start(t, s.Addr())
			r, _ := New(Options{Timeout: 10 * time.Second, Client: &http.Client{Transport: tr}})
			for i := range 2 {
				if _, err := r.Tokens(ctx, base, "m", []byte(tt.raw(words(fmt.Sprintf("q%d", i), 100)))); err != nil {
					t.Fatal(err)
				}
			}
			long := tt.raw(words("a long new question", 3*len(system)))
			got, err := r.Tokens(ctx, base, "m", []byte(long))
			if err != nil || !got.Whole || c.requests.Load() != 3 {
				t.Errorf("a prompt mostly new: whole %v, %d requests, err %v; want it rendered", got.Whole, c.requests.Load(), err)
			}
		})
	}
}

func TestPrefixStoreBound(t *testing.T) {
	for _, maxBytes := range []int64{4 << 10, 64 << 10} {
		t.Run(fmt.Sprint(maxBytes), func(t *testing.T) {
			p := newPrefixStore(maxBytes, 0.5)
			for i := range 200 {
				raw := []byte(words("shared", 1024) + words(fmt.Sprint(i), 512))
				lv := levels(1, raw)
				tokens := make([]uint32, len(raw)/4)
				for j := range tokens {
					tokens[j] = uint32(j)
				}
				tokens[len(tokens)-1] = uint32(1000 + i)
				p.observe(1, raw, lv, tokens)
				if p.bytes > maxBytes {
					t.Fatalf("after %d prompts %d bytes kept, the bound is %d", i+1, p.bytes, maxBytes)
				}
			}
			var sum int64
			for e := p.lru.Front(); e != nil; e = e.Next() {
				sum += e.Value.(*prefixEntry).size()
			}
			if sum != p.bytes {
				t.Errorf("the entries hold %d bytes, the count says %d", sum, p.bytes)
			}
			for _, m := range []map[uint64]*prefixEntry{p.seen, p.learned} {
				for k, e := range m {
					if !slices.Contains(e.levels, k) {
						t.Errorf("an entry is reached at a level it does not list")
					}
				}
			}
		})
	}
}
