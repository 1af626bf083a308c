// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"strings"
	"sync"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
)

// inFlightLog records each InFlightChanged call with the endpoint's own
// count at the time.
type inFlightLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *inFlightLog) InFlightChanged(pool *datastore.Pool, e *datastore.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, pool.Key.Name+" "+e.Address+" "+string(rune('0'+e.OwnInFlight())))
}

// TestInFlightObserver: the registry's load observers hear of the
// request's count going up on its pick and down when its response ends,
// with the count already changed.
func TestInFlightObserver(t *testing.T) {
	f := newPools(t, 1, 2)
	log := &inFlightLog{}
	f.reg.AddLoadObserver(log)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	g := ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	g.send(reqBody(completionBody("m", 10), true))
	dest, _ := mutationHeader(g.recv().GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
	g.recv()
	g.send(respHeaders([]hdr{{":status", "200", true}}, false, ""))
	g.recv()
	g.send(respBody([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`), true))
	g.recv()
	g.expectEOF()
	dest, _, _ = strings.Cut(dest, ",") // the primary, then fallbacks
	log.mu.Lock()
	defer log.mu.Unlock()
	pool := f.pools[0].Key.Name
	want := []string{pool + " " + dest + " 1", pool + " " + dest + " 0"}
	if len(log.calls) != 2 || log.calls[0] != want[0] || log.calls[1] != want[1] {
		t.Fatalf("calls %q, want %q", log.calls, want)
	}
}
