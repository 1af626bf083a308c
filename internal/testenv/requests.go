// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package testenv

import (
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// Request is one API request a process sent.
type Request struct {
	Method string
	// URL is the full request URL; its Path and Query tell the resource,
	// namespace, label selector and whether it is a watch.
	URL *url.URL
	// At is when the request was sent.
	At time.Time
	// Status is the response's HTTP status code; 0 when the request failed
	// without a response.
	Status int
}

// IsWatch reports whether the request is a watch (including a streaming
// list sent as a watch).
func (r Request) IsWatch() bool {
	return r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
}

// RequestLog records every request sent through a rest.Config it wrapped,
// and counts the bytes of the responses.
type RequestLog struct {
	mu            sync.Mutex
	requests      []Request
	responseBytes atomic.Int64
}

// Wrap returns a copy of cfg whose requests are recorded in l.
func (l *RequestLog) Wrap(cfg *rest.Config) *rest.Config {
	cp := rest.CopyConfig(cfg)
	cp.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &recordingTransport{log: l, next: rt} })
	return cp
}

// Requests returns the requests recorded so far, in the order sent.
func (l *RequestLog) Requests() []Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Request(nil), l.requests...)
}

// ResponseBytes is the number of response body bytes read so far.
func (l *RequestLog) ResponseBytes() int64 { return l.responseBytes.Load() }

type recordingTransport struct {
	log  *RequestLog
	next http.RoundTripper
}

func (t *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u := *req.URL
	t.log.mu.Lock()
	i := len(t.log.requests)
	t.log.requests = append(t.log.requests, Request{Method: req.Method, URL: &u, At: time.Now()})
	t.log.mu.Unlock()
	resp, err := t.next.RoundTrip(req)
	if resp != nil {
		t.log.mu.Lock()
		t.log.requests[i].Status = resp.StatusCode
		t.log.mu.Unlock()
	}
	if resp != nil && resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &t.log.responseBytes}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}
