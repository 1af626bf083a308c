// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
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
			got, err := r.Tokens(ctx, "http://"+s.Addr(), "m", []byte(tt.raw))
			if err != nil {
				t.Fatal(err)
			}
			if want := tokenizeAt(t, s.Addr(), tt.tokenizeBody); !slices.Equal(got, want) || len(got) == 0 {
				t.Errorf("render %v, tokenize %v", got, want)
			}
		})
	}
	ids, err := r.Tokens(ctx, "http://unused.invalid", "m", []byte(`[5, 6, 7]`))
	if err != nil || !slices.Equal(ids, []uint32{5, 6, 7}) {
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
				if err != nil || !slices.Equal(ids, []uint32{3}) {
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
