// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/peersync"
	"github.com/poolpicker/poolpicker/scheduling"
)

// TestPrecisePeerSync runs two replicas of a precise configuration with
// peer sync in front of the same servers: each replica sees the other's
// requests in flight, and the blocks of a pick are shared only on an
// endpoint whose events the replicas do not follow (the events tell every
// replica what a followed endpoint holds). The servers publish at the
// configured port; without events (nothing publishes at the port the
// config names), the learned index's blocks are shared as they are
// without precise scoring.
func TestPrecisePeerSync(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ips        []string
		events     bool
		wantBlocks bool
	}{
		{"events followed: in-flight counts only", []string{"127.0.94.2", "127.0.94.3", "127.0.94.4"}, true, false},
		{"no events: blocks too", []string{"127.0.95.2", "127.0.95.3", "127.0.95.4"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPreciseServers(t, tc.ips)
			config := preciseConfig
			if !tc.events {
				// A publisher port where none of the servers publishes.
				config = fmt.Sprintf(preciseConfig, freeOn(t, tc.ips), ps.replayPort)
			}
			lis := [2]net.Listener{}
			for i := range lis {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				lis[i] = l
			}
			secret := bytes.Repeat([]byte("k"), peersync.MinSecretBytes)
			exchange := func(i int) func(*datastore.Registry, **scheduling.Scheduler, prometheus.Registerer) *peersync.Exchange {
				return func(reg *datastore.Registry, sched **scheduling.Scheduler, prom prometheus.Registerer) *peersync.Exchange {
					x, err := peersync.New(peersync.Options{Registry: reg, HashKey: 7, Secret: secret, Registerer: prom, Listener: lis[i],
						Peers: func() []string { return []string{lis[1-i].Addr().String()} },
						Learner: peersync.LearnerFuncs{
							Learn: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
								(*sched).LearnPeerBlocks(pool, e, blocks)
							},
							Forget: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
								(*sched).ForgetPeerBlocks(pool, e, blocks)
							},
						}})
					if err != nil {
						t.Fatal(err)
					}
					return x
				}
			}
			a := newPrecisePicker(t, ps, config, exchange(0))
			b := newPrecisePicker(t, ps, config, exchange(1))
			if tc.events {
				a.followed(t)
				b.followed(t)
			}
			received := func(kind string) float64 {
				return promtest.Value(b.prom, peersync.MetricReceived, map[string]string{"kind": kind})
			}
			// held sends a request through a, and holds it in flight until b
			// counts it on the endpoint picked: every record a sent before
			// has then reached b too (one stream, in order).
			held := func(body []byte) {
				a.forwarding = func(endpoint string) {
					poll.Until(t, 10*time.Second, "the peer counting the request in flight", func() bool {
						e, ok := b.pool.Endpoints().Get(endpoint)
						return ok && e.InFlight() == 1
					})
				}
				defer func() { a.forwarding = nil }()
				a.send(body)
			}
			held(completionBody("barrier round 0", 4))
			blocksBefore := received("blocks")
			for p := range 6 {
				a.send(completionBody(fmt.Sprintf("prefix %d round 0", p), 20))
			}
			held(completionBody("barrier round 1", 4))
			if tc.wantBlocks {
				// A pick's blocks are shared when it is committed, after
				// the answer: they may trail the barrier's count.
				eventually(10*time.Second, func() bool { return received("blocks")-blocksBefore >= 6 })
			}
			blocks := received("blocks") - blocksBefore
			t.Logf("b received %v block records of a's picks, %v in-flight records", blocks, received("in-flight"))
			if received("in-flight") == 0 {
				t.Error("no in-flight records received")
			}
			if tc.wantBlocks && blocks < 6 {
				t.Errorf("%v block records of 7 picks, want every pick's", blocks)
			}
			if !tc.wantBlocks && blocks != 0 {
				t.Errorf("%v block records of picks on followed endpoints, want none", blocks)
			}
		})
	}
}
