// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package vllmpage_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// A model-server simulator serves its current state as a vLLM-sized page.
func Example() {
	state := vllmpage.State{Waiting: 2, Running: 4, KVCacheUsage: 0.3, BlockSize: 16, NumGPUBlocks: 4096}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if err := vllmpage.Write(w, state, vllmpage.Options{Engine: vllmpage.VLLM}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	fmt.Println(rec.Code, rec.Body.Len() >= vllmpage.DefaultMinBytes)
	// Output: 200 true
}
