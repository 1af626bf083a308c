// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/poolpicker/poolpicker/datastore"

	"github.com/poolpicker/poolpicker/controllers/podsource/internal/podwatch"
)

// refusingProxy is a loopback HTTP proxy in front of the test API server
// that answers the first pod requests of each label selector with the
// statuses it was given, as an API server under load does: 429 with
// Retry-After (priority and fairness rejecting a request), or 503 without
// it. It records when each pod request arrived.
type refusingProxy struct {
	namespace string
	mu        sync.Mutex
	// refusals are the answers still to give, by label selector.
	refusals map[string][]int
	// arrivals are the times of the pod requests, and the status each got
	// here (0: passed to the API server), by label selector.
	arrivals map[string][]arrival
}

type arrival struct {
	at     time.Time
	status int
}

// retryAfterSeconds is what the proxy's 429s ask for: the smallest value
// the header can carry.
const retryAfterSeconds = 1

func (p *refusingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if r.URL.Path != "/api/v1/namespaces/"+p.namespace+"/pods" {
		next.ServeHTTP(w, r)
		return
	}
	sel := r.URL.Query().Get("labelSelector")
	p.mu.Lock()
	status := 0
	if q := p.refusals[sel]; len(q) > 0 {
		status, p.refusals[sel] = q[0], q[1:]
	}
	p.arrivals[sel] = append(p.arrivals[sel], arrival{at: time.Now(), status: status})
	p.mu.Unlock()
	switch status {
	case 0:
		next.ServeHTTP(w, r)
		return
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", fmt.Sprint(retryAfterSeconds))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"refused by the test proxy","reason":%q,"code":%d}`,
		map[int]string{http.StatusTooManyRequests: "TooManyRequests", http.StatusServiceUnavailable: "ServiceUnavailable"}[status], status)
}

// startProxy serves p on loopback and returns a config that reaches the API
// server through it.
func startProxy(t *testing.T, p *refusingProxy) *rest.Config {
	t.Helper()
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:     upstream,
		FlushInterval: -1, // watch events pass at once
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.ServeHTTP(w, r, rp) }))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, QPS: 100, Burst: 100}
}

// TestRefusedWatchesArePaced puts a proxy that refuses pod requests, as an
// overloaded API server does, between the picker and the API server. A 429
// with Retry-After is retried once, after the time it asks for (client-go's
// handling, which the pod watches go through); a failure without it is
// retried by the pod watch after a backoff that doubles. Every pool syncs,
// and the API server gets no request beyond those retries: no retry storm.
// Both ways a watch starts are refused: a streaming list (one watch
// request) and a plain list followed by a watch.
func TestRefusedWatchesArePaced(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan Plan) {
		t.Run("streaming list", func(t *testing.T) { checkRefusalsPaced(t, plan, false) })
		t.Run("plain list", func(t *testing.T) { checkRefusalsPaced(t, plan, true) })
	})
}

func checkRefusalsPaced(t *testing.T, plan Plan, plainList bool) {
	ns := env.Namespace(t, "paced")
	const pools = 8
	const tooMany, unavailable = http.StatusTooManyRequests, http.StatusServiceUnavailable
	refusals := map[string][]int{}
	for i := range pools {
		sel := fmt.Sprintf("app=m%d", i)
		refusals[watchedSelector(plan, sel)] = []int{tooMany}
		createPod(t, ns, fmt.Sprintf("m%d", i), map[string]string{"app": fmt.Sprintf("m%d", i)}, ready(fmt.Sprintf("10.17.0.%d", i+1)))
	}
	// One watch is refused by a 429, then three times without
	// Retry-After (the pod watch's own backoff), then passes.
	refused := watchedSelector(plan, "app=m0")
	refusals[refused] = []int{tooMany, unavailable, unavailable, unavailable}
	want := map[string][]int{}
	for sel, q := range refusals {
		want[sel] = append(append([]int(nil), q...), 0)
		if plainList {
			want[sel] = append(want[sel], 0) // the list, then the watch from its version
		}
	}
	proxy := &refusingProxy{namespace: ns, refusals: refusals, arrivals: map[string][]arrival{}}
	r := start(t, startProxy(t, proxy), Options{Plan: plan, DisableStreamingLists: plainList})
	for i := range pools {
		r.serve(t, datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}, map[string]string{"app": fmt.Sprintf("m%d", i)}, 8000)
	}
	for i := range pools {
		r.waitEndpoints(t, datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}, fmt.Sprintf("10.17.0.%d:8000", i+1))
	}
	r.waitFor(t, "every pool synced", r.reg.AllSynced)
	if p, _ := r.reg.Get(datastore.PoolKey{Namespace: ns, Name: "pool-0"}); p.SyncError() != "" {
		t.Errorf("pool-0 still reports %q after syncing", p.SyncError())
	}

	// With a plain list the pool syncs before its watch is sent.
	r.waitFor(t, "every watch sent", func() bool {
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		for sel, q := range want {
			if len(proxy.arrivals[sel]) < len(q) {
				return false
			}
		}
		return true
	})
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	total := 0
	for sel, got := range proxy.arrivals {
		total += len(got)
		statuses := make([]int, len(got))
		for i, a := range got {
			statuses[i] = a.status
		}
		if fmt.Sprint(statuses) != fmt.Sprint(want[sel]) {
			t.Errorf("selector %q: answers %v, want %v (each refusal retried once, no more)", sel, statuses, want[sel])
			continue
		}
		backoff := podwatch.RetryInitial
		for i := 1; i < len(got); i++ {
			gap := got[i].at.Sub(got[i-1].at)
			var least time.Duration
			switch got[i-1].status {
			case tooMany:
				// Retry-After is whole seconds; allow the timer's slack.
				least = retryAfterSeconds*time.Second - 50*time.Millisecond
			case unavailable:
				least, backoff = backoff, 2*backoff
			}
			if gap < least {
				t.Errorf("selector %q: request %d came %v after a %d, want at least %v", sel, i+1, gap, got[i-1].status, least)
			}
		}
	}
	wantTotal := 0
	for _, q := range want {
		wantTotal += len(q)
	}
	if total != wantTotal {
		t.Errorf("%d pod requests, want %d (a list and a watch per pod watch, one more per refusal)", total, wantTotal)
	}
}
