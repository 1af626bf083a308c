// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--host", "127.0.0.11", "--port", "0", "--lora-modules", "a=/x, b", "--time-per-output-token", "-1ms"}, io.Discard, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-errc:
		t.Fatalf("run: %v", err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`"id":"a"`, `"id":"b"`, `"id":"meta-llama/Llama-3.1-8B-Instruct"`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("models %s lack %s", body, want)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--host", "localhost"}, `--host "localhost" is not an IP address`},
		{[]string{"--port", "70000"}, "--port 70000 outside 0..65535"},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--lora-modules", "a,a", "--port", "0"}, `adapter "a" listed twice`},
		{[]string{"--jitter", "2", "--port", "0"}, "jitter 2 outside"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want error containing %q", tt.args, err, tt.want)
		}
	}
}
