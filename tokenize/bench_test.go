// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// BenchmarkTokens is one prompt of a 6,000-byte system text and a new
// 120-byte question, tokenized by a render round trip to a model server on
// loopback (render), from a prefix learned from two earlier prompts
// (learned-prefix), and in process by a byte-level BPE tokenizer (local).
func BenchmarkTokens(b *testing.B) {
	s, err := modelsim.New(modelsim.Options{Model: "m", Addr: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	l, err := LoadLocal("testdata/bytelevel/tokenizer.json")
	if err != nil {
		b.Fatal(err)
	}
	system := words("system", 6000)
	prompt := func(i int) []byte { return []byte(fmt.Sprintf("%q", system+words(fmt.Sprintf("question%d", i), 120))) }
	ctx := context.Background()
	base := "http://" + s.Addr()
	for _, mode := range []string{"render", "learned-prefix", "local"} {
		b.Run(mode, func(b *testing.B) {
			opts := Options{Timeout: 10 * time.Second, Client: &http.Client{Transport: tr}, CacheEntries: 1}
			switch mode {
			case "render":
				opts.PrefixCacheBytes = -1
			case "local":
				opts.Local = map[string]*Local{"m": l}
			}
			r, err := New(opts)
			if err != nil {
				b.Fatal(err)
			}
			for i := range 2 {
				if _, err := r.Tokens(ctx, base, "m", prompt(-1-i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := r.Tokens(ctx, base, "m", prompt(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
