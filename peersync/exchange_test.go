// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

var poolKey = types.NamespacedName{Namespace: "ns", Name: "pool"}

// testSecret is the replicas' shared key in the tests.
var testSecret = []byte("a test key of more than sixteen bytes")

// learned is one LearnPeerBlocks call, or a ForgetPeerBlocks call when
// forget is set.
type learned struct {
	addr   string
	blocks []uint64
	forget bool
}

// side is one replica: a registry with the pool of two endpoints, an
// exchange serving on loopback, and what its learner heard.
type side struct {
	reg     *datastore.Registry
	pool    *datastore.Pool
	x       *Exchange
	lis     net.Listener
	learned chan learned
	metrics *prometheus.Registry
}

func newSide(t *testing.T, opts Options) *side {
	t.Helper()
	s := &side{reg: datastore.NewRegistry(), learned: make(chan learned, 64), metrics: prometheus.NewRegistry()}
	s.pool = s.reg.Upsert(poolKey, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}})
	s.pool.SetPods([]datastore.EndpointSource{
		{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, UID: "a", IP: "127.0.0.2"},
		{Pod: types.NamespacedName{Namespace: "ns", Name: "b"}, UID: "b", IP: "127.0.0.3"},
	})
	var err error
	if s.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	opts.Registry, opts.Listener, opts.Registerer = s.reg, s.lis, s.metrics
	if opts.Secret == nil {
		opts.Secret = testSecret
	}
	opts.Learner = LearnerFuncs{
		Learn: func(_ *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
			s.learned <- learned{e.Address, slices.Clone(blocks), false}
		},
		Forget: func(_ *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
			s.learned <- learned{e.Address, slices.Clone(blocks), true}
		},
	}
	if s.x, err = New(opts); err != nil {
		t.Fatal(err)
	}
	return s
}

// start runs the exchange until the test ends.
func (s *side) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.x.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (s *side) endpoint(t *testing.T, addr string) *datastore.Endpoint {
	t.Helper()
	e, ok := s.pool.Endpoints().Get(addr)
	if !ok {
		t.Fatalf("no endpoint %s", addr)
	}
	return e
}

// TestExchange runs two replicas' exchanges against each other over
// loopback gRPC: one's picks (blocks), what its servers' reports made it
// forget, and its in-flight counts reach the other, and the counts are
// taken back when the sender goes.
func TestExchange(t *testing.T) {
	var a, b *side
	// B takes streams from A only; A dials from the address B knows it by.
	b = newSide(t, Options{HashKey: 7, OnlyPeers: true, Peers: func() []string { return []string{a.lis.Addr().String()} }})
	a = newSide(t, Options{HashKey: 7, LocalIP: net.IPv4(127, 0, 0, 1), Peers: func() []string { return []string{b.lis.Addr().String()} }})
	b.start(t)
	ctx, stopA := context.WithCancel(context.Background())
	doneA := make(chan struct{})
	go func() { _ = a.x.Start(ctx); close(doneA) }()
	defer func() { stopA(); <-doneA }()

	ea := a.endpoint(t, "127.0.0.2:8000")
	pool, ep := views(a.pool, ea)
	a.x.ShareBlocks(pool, ep, []uint64{1, 2, 3})
	got := <-b.learned
	if got.addr != "127.0.0.2:8000" || !slices.Equal(got.blocks, []uint64{1, 2, 3}) || got.forget {
		t.Fatalf("learned %+v, want 127.0.0.2:8000 [1 2 3]", got)
	}
	a.x.ForgetBlocks(pool, ep, []uint64{3, 2})
	if got := <-b.learned; got.addr != "127.0.0.2:8000" || !slices.Equal(got.blocks, []uint64{3, 2}) || !got.forget {
		t.Fatalf("heard %+v, want 127.0.0.2:8000 [3 2] forgotten", got)
	}

	ea.AddInFlight(2)
	a.x.InFlightChanged(a.pool, ea)
	eb := b.endpoint(t, "127.0.0.2:8000")
	poll.Until(t, 10*time.Second, "the peer's 2 in flight", func() bool { return eb.InFlight() == 2 })
	if eb.OwnInFlight() != 0 {
		t.Fatalf("own in flight %d, want 0: a peer's requests are not this replica's", eb.OwnInFlight())
	}
	ea.AddInFlight(-1)
	a.x.InFlightChanged(a.pool, ea)
	poll.Until(t, 10*time.Second, "the peer's 1 in flight", func() bool { return eb.InFlight() == 1 })
	if a.endpoint(t, "127.0.0.2:8000").InFlight() != 1 {
		t.Fatal("the sender's own count changed")
	}

	stopA()
	<-doneA
	poll.Until(t, 10*time.Second, "the gone peer's count taken back", func() bool { return eb.InFlight() == 0 })
	for _, kind := range []string{"blocks", "forget"} {
		if n := testutil.ToFloat64(b.x.metrics.received.WithLabelValues(kind)); n != 1 {
			t.Fatalf("%s{kind=%s} %v, want 1", MetricReceived, kind, n)
		}
	}
}

// TestFramesKeepOrder: records gathered in one flush reach a peer in the
// order they were made, a forget between two picks of the same blocks
// included, though forget records travel in frames of their own.
func TestFramesKeepOrder(t *testing.T) {
	s := newSide(t, Options{})
	e := s.endpoint(t, "127.0.0.2:8000")
	pool, ep := views(s.pool, e)
	s.x.ShareBlocks(pool, ep, []uint64{1})
	s.x.ForgetBlocks(pool, ep, []uint64{1})
	s.x.ForgetBlocks(pool, ep, []uint64{2})
	s.x.ShareBlocks(pool, ep, []uint64{1})
	e.AddInFlight(1)
	s.x.InFlightChanged(s.pool, e)
	var kinds []byte
	var forgetFrames []bool
	for _, f := range s.x.pendingFrames() {
		forgetFrames = append(forgetFrames, f.forget)
		if err := decodeFrame(f.b, func(r *record) {
			if (r.kind == kindForget) != f.forget {
				t.Errorf("a record of kind %d in a frame with forget %v", r.kind, f.forget)
			}
			kinds = append(kinds, r.kind)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if want := []byte{kindBlocks, kindForget, kindForget, kindBlocks, kindInFlight}; !slices.Equal(kinds, want) {
		t.Fatalf("records %v, want %v", kinds, want)
	}
	if want := []bool{false, true, false}; !slices.Equal(forgetFrames, want) {
		t.Fatalf("frames' forget %v, want %v", forgetFrames, want)
	}
}

// TestForgetNotSentToPreviousRelease: a peer of the release before forget
// records (its headers do not say it reads them) would refuse a frame
// holding one and close the stream; the sender leaves them out of its
// stream, which keeps carrying the picks.
func TestForgetNotSentToPreviousRelease(t *testing.T) {
	var a, b *side
	b = newSide(t, Options{Peers: func() []string { return []string{a.lis.Addr().String()} }})
	b.x.legacy = true
	a = newSide(t, Options{Peers: func() []string { return []string{b.lis.Addr().String()} }})
	b.start(t)
	a.start(t)
	ea := a.endpoint(t, "127.0.0.2:8000")
	pool, e := views(a.pool, ea)
	a.x.ShareBlocks(pool, e, []uint64{1})
	if got := <-b.learned; !slices.Equal(got.blocks, []uint64{1}) || got.forget {
		t.Fatalf("learned %+v, want [1]", got)
	}
	a.x.ForgetBlocks(pool, e, []uint64{1})
	a.x.ShareBlocks(pool, e, []uint64{2})
	if got := <-b.learned; !slices.Equal(got.blocks, []uint64{2}) || got.forget {
		t.Fatalf("heard %+v after a forget, want [2] learned on the same stream", got)
	}
	if n := testutil.ToFloat64(b.x.metrics.dropped.WithLabelValues("malformed")) + testutil.ToFloat64(b.x.metrics.received.WithLabelValues("forget")); n != 0 {
		t.Fatalf("%v forget or malformed records at the peer of the release before, want 0", n)
	}
	if n := testutil.ToFloat64(b.x.metrics.streams); n != 1 {
		t.Fatalf("%v inbound streams, want the one it had", n)
	}
}

// TestHostilePeer sends what a peer gone wrong (or an attacker that can
// reach the port) might: every bad frame closes its stream with an error
// and applies nothing after the bad record; counts are bounded; records
// beyond the rate limit are dropped; what names no pool or endpoint here
// is dropped.
func TestHostilePeer(t *testing.T) {
	b := newSide(t, Options{MaxRecordsPerSecond: 5, MaxInFlightPerEndpoint: 100})
	b.start(t)
	conn := dialFrom(t, b.lis.Addr().String(), "127.0.0.1")
	push := func(frames ...[]byte) error {
		t.Helper()
		ps := openPeerStream(t, conn, b, testSecret, "hostile")
		if ps.err != nil {
			t.Fatal(ps.err)
		}
		for _, f := range frames {
			if err := ps.send(f); err != nil {
				break
			}
		}
		return ps.finish()
	}
	eb := b.endpoint(t, "127.0.0.3:8000")
	blocks := record{kind: kindBlocks, pool: poolKey, addr: "127.0.0.3:8000", blocks: []uint64{9}}
	forget := record{kind: kindForget, pool: poolKey, addr: "127.0.0.3:8000", blocks: []uint64{9}}

	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"empty", []byte{}},
		{"other version", protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)},
		{"not a frame", []byte{0xff, 0xff, 0xff}},
		{"unknown kind", encodeFrame(record{kind: 9, pool: poolKey, addr: "127.0.0.3:8000"})},
		{"truncated record", append(encodeFrame(), 0x12, 5, 'n')},
		{"name longer than the API server allows", encodeFrame(record{kind: kindBlocks, pool: types.NamespacedName{Namespace: "ns", Name: strings.Repeat("n", 300)}, addr: "127.0.0.3:8000", blocks: []uint64{9}})},
		{"too many blocks", encodeFrame(record{kind: kindBlocks, pool: poolKey, addr: "127.0.0.3:8000", blocks: make([]uint64, MaxBlocksPerRecord+1)})},
		{"truncated blocks", encodeFrame(blocks)[:len(encodeFrame(blocks))-1]},
		{"too many blocks forgotten", encodeFrame(record{kind: kindForget, pool: poolKey, addr: "127.0.0.3:8000", blocks: make([]uint64, MaxBlocksPerRecord+1)})},
		{"truncated blocks forgotten", encodeFrame(forget)[:len(encodeFrame(forget))-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := push(tc.frame); err == nil {
				t.Fatal("stream ended without an error")
			}
			select {
			case l := <-b.learned:
				t.Fatalf("learned %+v from a malformed frame", l)
			default:
			}
		})
	}

	// An in-flight count beyond the bound counts as the bound, and is
	// taken back with the stream.
	ps := openPeerStream(t, conn, b, testSecret, "hostile")
	if ps.err != nil {
		t.Fatal(ps.err)
	}
	if err := ps.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.3:8000", inFlight: 1 << 40})); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the bounded count", func() bool { return eb.InFlight() == 100 })
	_ = ps.finish()
	poll.Until(t, 10*time.Second, "the count taken back", func() bool { return eb.InFlight() == 0 })

	// Unknown pool and endpoint, then more records than the rate allows.
	unknown := []record{
		{kind: kindBlocks, pool: types.NamespacedName{Namespace: "ns", Name: "other"}, addr: "127.0.0.3:8000", blocks: []uint64{1}},
		{kind: kindForget, pool: poolKey, addr: "127.0.0.9:8000", blocks: []uint64{1}},
	}
	many := make([]record, 10)
	for i := range many {
		many[i] = record{kind: kindBlocks + byte(i%2)*(kindForget-kindBlocks), pool: poolKey, addr: "127.0.0.3:8000", blocks: []uint64{uint64(i)}}
	}
	if err := push(encodeFrame(append(unknown, many...)...)); err != nil {
		t.Fatalf("a well-formed stream ended with %v", err)
	}
	if n := testutil.ToFloat64(b.x.metrics.dropped.WithLabelValues("unknown")); n != 2 {
		t.Fatalf("dropped{reason=unknown} %v, want 2", n)
	}
	// The bucket holds 5 records; the 2 unknown ones took 2 (the time
	// between refills at most a few).
	learnedN := len(b.learned)
	rate := testutil.ToFloat64(b.x.metrics.dropped.WithLabelValues("rate"))
	if learnedN+int(rate) != len(many) || rate < 5 {
		t.Fatalf("learned %d and dropped %v for the rate of %d records, want at least 5 dropped", learnedN, rate, len(many))
	}
}

// TestOnlyPeers: with OnlyPeers, a stream from a host that is no peer's
// is refused before anything it sends is read; one from a peer's host,
// named by its IP or by a name that resolves to it, is taken.
func TestOnlyPeers(t *testing.T) {
	for _, tc := range []struct {
		peer, from string
		want       codes.Code
	}{
		{"127.0.0.7:1", "127.0.0.1", codes.PermissionDenied},
		{"127.0.0.7:1", "127.0.0.7", codes.OK},
		{"localhost:1", "127.0.0.1", codes.OK},
		{"localhost:1", "127.0.0.7", codes.PermissionDenied},
	} {
		t.Run(tc.peer+" from "+tc.from, func(t *testing.T) {
			b := newSide(t, Options{OnlyPeers: true, Peers: func() []string { return []string{tc.peer} }})
			b.start(t)
			ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), tc.from), b, testSecret, "peer")
			if ps.err == nil {
				ps.err = ps.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: 3}))
				if ps.err == nil {
					ps.err = ps.finish()
				}
			}
			if got := status.Code(ps.err); got != tc.want {
				t.Fatalf("%v (%v), want %v", got, ps.err, tc.want)
			}
			wantRefused, wantApplied := 0.0, 1.0
			if tc.want != codes.OK {
				wantRefused, wantApplied = 1, 0
			}
			if n := testutil.ToFloat64(b.x.metrics.refused.WithLabelValues("not-a-peer")); n != wantRefused {
				t.Errorf("%s{reason=not-a-peer} %v, want %v", MetricRefused, n, wantRefused)
			}
			if n := testutil.ToFloat64(b.x.metrics.received.WithLabelValues("in-flight")); n != wantApplied {
				t.Errorf("%s{kind=in-flight} %v, want %v", MetricReceived, n, wantApplied)
			}
		})
	}
}

// TestKeyMismatch: replicas keyed differently, whose blocks would never
// match, refuse each other's streams and count it, instead of applying
// picks to blocks nobody else has; the sender stops dialling. A stream
// without the key's fingerprint (a sender of the release before it) is
// taken, as TestOnlyPeers shows.
func TestKeyMismatch(t *testing.T) {
	var a, b *side
	b = newSide(t, Options{HashKey: 7})
	a = newSide(t, Options{HashKey: 8, Peers: func() []string { return []string{b.lis.Addr().String()} }})
	b.start(t)
	a.start(t)
	poll.Until(t, 10*time.Second, "the stream refused for its key", func() bool {
		return testutil.ToFloat64(b.x.metrics.keyMismatch) == 1
	})
	poll.Until(t, 10*time.Second, "the sender to stop counting the peer", func() bool { return testutil.ToFloat64(a.x.metrics.peers) == 0 })
	ea := a.endpoint(t, "127.0.0.2:8000")
	ea.AddInFlight(1)
	a.x.InFlightChanged(a.pool, ea)
	pool, ep := views(a.pool, ea)
	a.x.ShareBlocks(pool, ep, []uint64{1})
	if n := testutil.ToFloat64(b.x.metrics.streams); n != 0 {
		t.Fatalf("%s %v, want 0", MetricStreams, n)
	}
	if got := b.endpoint(t, "127.0.0.2:8000").InFlight(); got != 0 {
		t.Fatalf("in flight %d from a peer of another key, want 0", got)
	}
	if n := testutil.ToFloat64(b.x.metrics.keyMismatch); n != 1 {
		t.Fatalf("%s %v, want 1: the sender must not retry", MetricKeyMismatch, n)
	}
	if keyFingerprint(7) == keyFingerprint(8) || len(keyFingerprint(7)) != 16 {
		t.Fatalf("fingerprints %s, %s", keyFingerprint(7), keyFingerprint(8))
	}
}

// TestSelfIsNoPeer: a replica whose peer list names itself (discovery
// lists every ready replica) refuses its own stream and stops dialling it,
// so it never counts its own requests twice.
func TestSelfIsNoPeer(t *testing.T) {
	var s *side
	s = newSide(t, Options{Peers: func() []string { return []string{s.lis.Addr().String()} }})
	s.start(t)
	poll.Until(t, 10*time.Second, "the peer found to be this replica", func() bool { return testutil.ToFloat64(s.x.metrics.peers) == 0 })
	e := s.endpoint(t, "127.0.0.2:8000")
	e.AddInFlight(1)
	s.x.InFlightChanged(s.pool, e)
	pool, ep := views(s.pool, e)
	s.x.ShareBlocks(pool, ep, []uint64{1})
	if n := testutil.ToFloat64(s.x.metrics.received.WithLabelValues("in-flight")) + testutil.ToFloat64(s.x.metrics.received.WithLabelValues("blocks")); n != 0 {
		t.Fatalf("%v records received from itself", n)
	}
	if e.InFlight() != 1 {
		t.Fatalf("in flight %d, want 1", e.InFlight())
	}
}

// TestFrames round-trips records through a frame, and splits a batch into
// frames of the size bound.
func TestFrames(t *testing.T) {
	x := &Exchange{opts: Options{MaxFrameBytes: 200}, metrics: mustMetrics(t)}
	var recs []record
	for i := range 12 {
		recs = append(recs, record{kind: kindBlocks, pool: poolKey, addr: fmt.Sprintf("10.0.0.%d:8000", i), blocks: []uint64{uint64(i), 1 << 63}},
			record{kind: kindInFlight, pool: poolKey, addr: fmt.Sprintf("10.0.0.%d:8000", i), inFlight: int64(i)},
			record{kind: kindForget, pool: poolKey, addr: fmt.Sprintf("10.0.0.%d:8000", i), blocks: []uint64{1 << 62, uint64(i)}})
	}
	recs = append(recs, record{kind: kindBlocks, pool: types.NamespacedName{Name: string(make([]byte, 300))}})
	frames := x.encode(recs)
	if len(frames) < 2 {
		t.Fatalf("%d frames, want the batch split", len(frames))
	}
	var got []record
	for _, f := range frames {
		if len(f) > 200+60 {
			t.Fatalf("frame of %d bytes", len(f))
		}
		if err := decodeFrame(f, func(r *record) {
			c := *r
			c.blocks = slices.Clone(r.blocks)
			got = append(got, c)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 36 {
		t.Fatalf("%d records decoded, want 36 (the invalid one skipped)", len(got))
	}
	for i, r := range got {
		w := recs[i]
		if r.kind != w.kind || r.pool != w.pool || r.addr != w.addr || r.inFlight != w.inFlight || !slices.Equal(r.blocks, w.blocks) {
			t.Fatalf("record %d: %+v, want %+v", i, r, w)
		}
	}
}

func mustMetrics(t *testing.T) *metrics {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// views are the pool and endpoint as the scheduler's plugins hand them to
// peer sync (framework.Peers): all it reads of them is the pool's key and
// the endpoint's address.
func views(p *datastore.Pool, e *datastore.Endpoint) (framework.Pool, framework.Endpoint) {
	ep := frameworktest.NewEndpoint(e.Address, e.Labels)
	return frameworktest.NewPool(p.Key.Namespace, p.Key.Name, ep), ep
}
