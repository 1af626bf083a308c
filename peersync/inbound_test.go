// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
)

// frame encodes records as a sender does.
func encodeFrame(recs ...record) []byte {
	out := append([]byte{}, frameHeader...)
	for i := range recs {
		out = appendRecord(out, &recs[i])
	}
	return out
}

// dialFrom is a plaintext connection to target from the local address
// from, as a replica or an attacker at that address would make.
func dialFrom(t *testing.T, target, from string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) })}, opts...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// peerStream is a stream to a side opened by hand, as a replica holding
// secret would open it: err is why it was refused.
type peerStream struct {
	s    grpc.ClientStream
	sess *session
	err  error
}

// openPeerStream opens a stream on conn to b as the replica id holding
// secret: the handshake of auth.go, then its proof.
func openPeerStream(t *testing.T, conn *grpc.ClientConn, b *side, secret []byte, id string) *peerStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return openStreamWith(ctx, conn, secret, id, keyFingerprint(b.x.opts.HashKey), true)
}

func openStreamWith(ctx context.Context, conn *grpc.ClientConn, secret []byte, id, keyPrint string, prove bool) *peerStream {
	nonce, err := newNonce()
	if err != nil {
		return &peerStream{err: err}
	}
	ctx = metadata.AppendToOutgoingContext(ctx, idHeader, id, keyHeader, keyPrint, nonceHeader, nonce)
	s, err := conn.NewStream(ctx, &wirepb.PeerSync_ServiceDesc.Streams[0], wirepb.PeerSync_Push_FullMethodName)
	if err != nil {
		return &peerStream{err: err}
	}
	md, err := s.Header()
	if err != nil {
		return &peerStream{err: err}
	}
	if md == nil {
		return &peerStream{err: s.RecvMsg(&wirepb.Sealed{})}
	}
	dialler := &Exchange{opts: Options{Secret: secret}, id: id}
	sess, err := dialler.verifyReceiver(s.Context(), md, nonce)
	if err != nil {
		return &peerStream{err: err}
	}
	ps := &peerStream{s: s, sess: sess}
	if prove {
		ps.err = s.SendMsg(&wirepb.Sealed{Value: sess.proof(roleDialler)})
	}
	return ps
}

func (ps *peerStream) send(f []byte) error {
	return ps.s.SendMsg(&wirepb.Sealed{Value: ps.sess.seal(f)})
}

// answer waits for the receiver to end the stream, and returns its answer.
func (ps *peerStream) answer() error { return ps.s.RecvMsg(&wirepb.Sealed{}) }

// finish ends the stream and returns the receiver's answer.
func (ps *peerStream) finish() error {
	if err := ps.s.CloseSend(); err != nil {
		return err
	}
	err := ps.s.RecvMsg(&wirepb.Sealed{})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// TestAuthentication: a stream is applied only once its sender proved it
// holds the Secret; without a key, with a wrong key, with a proof made for
// another stream or with a frame whose tag does not match, it is refused
// and nothing of it is applied.
func TestAuthentication(t *testing.T) {
	b := newSide(t, Options{})
	b.start(t)
	conn := dialFrom(t, b.lis.Addr().String(), "127.0.0.1")
	inFlight := encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: 3})
	eb := b.endpoint(t, "127.0.0.2:8000")
	keyPrint := keyFingerprint(b.x.opts.HashKey)

	// A proof recorded from one stream, for replay on another.
	first := openPeerStream(t, conn, b, testSecret, "recorded")
	if first.err != nil {
		t.Fatal(first.err)
	}
	recorded := first.sess.proof(roleDialler)
	_ = first.finish()

	for _, tc := range []struct {
		name string
		open func(ctx context.Context) error
	}{
		{"no key, nonce or id", func(ctx context.Context) error {
			s, err := conn.NewStream(ctx, &wirepb.PeerSync_ServiceDesc.Streams[0], wirepb.PeerSync_Push_FullMethodName)
			if err != nil {
				return err
			}
			_ = s.SendMsg(&wirepb.Sealed{Value: inFlight})
			_ = s.CloseSend()
			return s.RecvMsg(&wirepb.Sealed{})
		}},
		{"a key's fingerprint but no nonce", func(ctx context.Context) error {
			ctx = metadata.AppendToOutgoingContext(ctx, idHeader, "x", keyHeader, keyPrint)
			s, err := conn.NewStream(ctx, &wirepb.PeerSync_ServiceDesc.Streams[0], wirepb.PeerSync_Push_FullMethodName)
			if err != nil {
				return err
			}
			_ = s.SendMsg(&wirepb.Sealed{Value: inFlight})
			_ = s.CloseSend()
			return s.RecvMsg(&wirepb.Sealed{})
		}},
		{"another secret", func(ctx context.Context) error {
			// The dialler cannot check the receiver's proof either.
			ps := openStreamWith(ctx, conn, []byte("another key of sixteen bytes or more"), "x", keyPrint, false)
			if !errors.Is(ps.err, errUnauthenticated) {
				return fmt.Errorf("the dialler took the receiver's proof: %w", ps.err)
			}
			// Send a proof under the wrong key regardless.
			ps = openStreamWith(ctx, conn, testSecret, "x", keyPrint, false)
			if ps.err != nil {
				return ps.err
			}
			wrong := newSession([]byte("another key of sixteen bytes or more"), "", "", "", "", nil)
			_ = ps.s.SendMsg(&wirepb.Sealed{Value: wrong.proof(roleDialler)})
			_ = ps.send(inFlight)
			return ps.finish()
		}},
		{"a proof replayed from another stream", func(ctx context.Context) error {
			ps := openStreamWith(ctx, conn, testSecret, "recorded", keyPrint, false)
			if ps.err != nil {
				return ps.err
			}
			_ = ps.s.SendMsg(&wirepb.Sealed{Value: recorded})
			_ = ps.send(inFlight)
			return ps.finish()
		}},
		{"a frame without a valid tag", func(ctx context.Context) error {
			ps := openStreamWith(ctx, conn, testSecret, "x", keyPrint, true)
			if ps.err != nil {
				return ps.err
			}
			_ = ps.s.SendMsg(&wirepb.Sealed{Value: append(make([]byte, tagBytes), inFlight...)})
			return ps.finish()
		}},
		{"a frame replayed", func(ctx context.Context) error {
			ps := openStreamWith(ctx, conn, testSecret, "x", keyPrint, true)
			if ps.err != nil {
				return ps.err
			}
			heartbeat := ps.sess.seal(frameHeader)
			_ = ps.s.SendMsg(&wirepb.Sealed{Value: heartbeat})
			_ = ps.s.SendMsg(&wirepb.Sealed{Value: heartbeat})
			_ = ps.send(inFlight)
			return ps.finish()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(b.x.metrics.refused.WithLabelValues("unauthenticated"))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := tc.open(ctx); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("%v, want Unauthenticated", err)
			}
			if n := testutil.ToFloat64(b.x.metrics.refused.WithLabelValues("unauthenticated")); n != before+1 {
				t.Fatalf("%s{reason=unauthenticated} %v, want %v", MetricRefused, n, before+1)
			}
			if n := testutil.ToFloat64(b.x.metrics.received.WithLabelValues("in-flight")); n != 0 || eb.InFlight() != 0 {
				t.Fatalf("%v in-flight records applied, in flight %d: want none", n, eb.InFlight())
			}
		})
	}

	// The same frame on an authenticated stream is applied.
	ps := openPeerStream(t, conn, b, testSecret, "replica")
	if ps.err != nil {
		t.Fatal(ps.err)
	}
	if err := ps.send(inFlight); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the authenticated peer's count", func() bool { return eb.InFlight() == 3 })
	if err := ps.finish(); err != nil {
		t.Fatal(err)
	}
}

// selfSigned is a TLS server configuration with a fresh self-signed
// certificate, as the replicas' usually are.
func selfSigned(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "poolpicker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// clientTLS is what the replicas dial each other with: the certificate is
// not checked, the proof bound to the session is.
func clientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // the peer proves the key over the session
}

// TestRelayIsRefused: over TLS, a relay between two replicas (it ends the
// dialler's TLS session and opens its own to the receiver, passing every
// header and message on) cannot make either accept the other: the proofs
// are bound to the session they were made in, and the dialler, which
// checks the receiver's first, sends nothing. Two replicas dialling each
// other directly over TLS stream as they do in plaintext.
func TestRelayIsRefused(t *testing.T) {
	var a, b *side
	b = newSide(t, Options{ServerTLS: selfSigned(t), Peers: func() []string { return nil }})
	b.start(t)
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := dialFrom(t, b.lis.Addr().String(), "127.0.0.1", grpc.WithTransportCredentials(credentials.NewTLS(clientTLS())))
	relayed := make(chan int, 16)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(selfSigned(t))), grpc.UnknownServiceHandler(func(_ any, in grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(in.Context())
		out, err := upstream.NewStream(metadata.NewOutgoingContext(in.Context(), md), &wirepb.PeerSync_ServiceDesc.Streams[0], wirepb.PeerSync_Push_FullMethodName)
		if err != nil {
			return err
		}
		hdr, err := out.Header()
		if err != nil {
			return err
		}
		if err := in.SendHeader(hdr); err != nil {
			return err
		}
		n := 0
		defer func() {
			select {
			case relayed <- n:
			default:
			}
		}()
		for {
			var m wirepb.Sealed
			if err := in.RecvMsg(&m); err != nil {
				return nil
			}
			n++
			if err := out.SendMsg(&m); err != nil {
				return nil
			}
		}
	}))
	go func() { _ = srv.Serve(relay) }()
	t.Cleanup(srv.Stop)

	a = newSide(t, Options{ClientTLS: clientTLS(), Peers: func() []string { return []string{relay.Addr().String()} }})
	a.start(t)
	poll.Until(t, 10*time.Second, "the dialler refusing the relayed receiver", func() bool {
		return testutil.ToFloat64(a.x.metrics.unverified) >= 1
	})
	if n := <-relayed; n != 0 {
		t.Fatalf("the dialler sent %d messages through the relay, want none", n)
	}
	if n := testutil.ToFloat64(b.x.metrics.streams); n != 0 {
		t.Fatalf("%s %v at the receiver behind the relay, want 0", MetricStreams, n)
	}

	// Directly, over TLS, the same two stream.
	c := newSide(t, Options{ClientTLS: clientTLS(), Peers: func() []string { return []string{b.lis.Addr().String()} }})
	c.start(t)
	ec := c.endpoint(t, "127.0.0.2:8000")
	ec.AddInFlight(2)
	c.x.InFlightChanged(c.pool, ec)
	eb := b.endpoint(t, "127.0.0.2:8000")
	poll.Until(t, 10*time.Second, "the count over TLS", func() bool { return eb.InFlight() == 2 })
}

// TestPeerFlood: what one address can do with the key is bounded per
// address: connections beyond the bound are closed, streams beyond it
// refused, and however many streams report the largest count, the
// endpoint's count from the peers stays within MaxInFlightPerEndpoint (80
// streams of 4096 each used to make it 327,680).
func TestPeerFlood(t *testing.T) {
	const limit = 100
	newB := func() *side {
		b := newSide(t, Options{OnlyPeers: true, MaxInFlightPerEndpoint: limit, Peers: func() []string { return []string{"127.0.0.1:1"} }})
		b.start(t)
		return b
	}
	inFlight := encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: MaxInFlightBound})

	// 80 streams, each on a connection of its own, each with the largest
	// count: as many as the connections allowed are taken, the rest are
	// closed with their connection.
	b := newB()
	eb := b.endpoint(t, "127.0.0.2:8000")
	var open []*peerStream
	for i := range 80 {
		ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), b, testSecret, fmt.Sprintf("flood-%d", i))
		if ps.err == nil {
			ps.err = ps.send(inFlight)
		}
		if ps.err == nil {
			open = append(open, ps)
		}
	}
	if len(open) != DefaultMaxConnectionsPerPeer {
		t.Fatalf("%d streams taken on connections of their own, want %d", len(open), DefaultMaxConnectionsPerPeer)
	}
	poll.Until(t, 10*time.Second, "the flood's count at the bound", func() bool { return eb.InFlight() == limit })
	for _, l := range []string{"connections", "in-flight"} {
		if n := testutil.ToFloat64(b.x.metrics.limited.WithLabelValues("127.0.0.1", l)); n < 1 {
			t.Errorf("%s{peer=127.0.0.1,limit=%s} %v, want some", MetricLimited, l, n)
		}
	}
	for _, ps := range open {
		_ = ps.finish()
	}
	poll.Until(t, 10*time.Second, "the flood's count taken back", func() bool { return eb.InFlight() == 0 })

	// 80 streams over two connections (a connection takes as many at
	// once as the address may have; more wait in the client): as many as
	// the address may have are taken, the rest refused.
	b = newB()
	eb = b.endpoint(t, "127.0.0.2:8000")
	conns := []*grpc.ClientConn{dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), dialFrom(t, b.lis.Addr().String(), "127.0.0.1")}
	open = open[:0]
	for i := range 80 {
		ps := openPeerStream(t, conns[i%2], b, testSecret, fmt.Sprintf("multiplexed-%d", i))
		if ps.err == nil {
			ps.err = ps.send(inFlight)
		}
		if ps.err == nil {
			open = append(open, ps)
		}
	}
	if len(open) != DefaultMaxStreamsPerPeer {
		t.Fatalf("%d streams on two connections, want %d", len(open), DefaultMaxStreamsPerPeer)
	}
	poll.Until(t, 10*time.Second, "the flood's count at the bound", func() bool { return eb.InFlight() == limit })
	if n := testutil.ToFloat64(b.x.metrics.limited.WithLabelValues("127.0.0.1", "streams")); n < 1 {
		t.Errorf("%s{peer=127.0.0.1,limit=streams} %v, want some", MetricLimited, n)
	}
	for _, ps := range open {
		_ = ps.finish()
	}
	poll.Until(t, 10*time.Second, "the flood's count taken back", func() bool { return eb.InFlight() == 0 })
}

// TestRecordBudgetPerPeer: an address's streams share one record budget,
// so opening more streams does not buy more records.
func TestRecordBudgetPerPeer(t *testing.T) {
	const rate = 1000
	b := newSide(t, Options{MaxRecordsPerSecond: rate})
	b.start(t)
	conn := dialFrom(t, b.lis.Addr().String(), "127.0.0.1")
	var recs []record
	for i := range rate {
		recs = append(recs, record{kind: kindBlocks, pool: poolKey, addr: "127.0.0.3:8000", blocks: []uint64{uint64(i)}})
	}
	f := encodeFrame(recs...)
	var streams []*peerStream
	for i := range 3 {
		ps := openPeerStream(t, conn, b, testSecret, fmt.Sprintf("s%d", i))
		if ps.err != nil {
			t.Fatal(ps.err)
		}
		streams = append(streams, ps)
	}
	drained := make(chan struct{})
	defer close(drained)
	go func() {
		for {
			select {
			case <-b.learned:
			case <-drained:
				return
			}
		}
	}()
	for _, ps := range streams {
		if err := ps.send(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, ps := range streams {
		if err := ps.finish(); err != nil {
			t.Fatal(err)
		}
	}
	// Budgets of their own would have let all 3,000 in; one budget of
	// 1,000 lets in 1,000 and what refills while they are read.
	applied := testutil.ToFloat64(b.x.metrics.received.WithLabelValues("blocks"))
	dropped := testutil.ToFloat64(b.x.metrics.limited.WithLabelValues(otherHost, "records"))
	if applied+dropped != 3*rate || applied >= 2*rate {
		t.Fatalf("applied %v, dropped %v of %d records from one address with a budget of %d a second: want at most %d applied", applied, dropped, 3*rate, rate, 2*rate)
	}
}

// TestRelabelCountsOnce: a pod relabelled (the same UID and IP, new
// labels) keeps one count per peer: the peer's 3 stays 3, not 6, and its
// 0 leaves 0.
func TestRelabelCountsOnce(t *testing.T) {
	b := newSide(t, Options{})
	b.start(t)
	ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), b, testSecret, "peer")
	if ps.err != nil {
		t.Fatal(ps.err)
	}
	count := func(n int64) {
		t.Helper()
		if err := ps.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: n})); err != nil {
			t.Fatal(err)
		}
	}
	applied := func() float64 { return testutil.ToFloat64(b.x.metrics.received.WithLabelValues("in-flight")) }
	count(3)
	poll.Until(t, 10*time.Second, "the peer's 3", func() bool { return b.endpoint(t, "127.0.0.2:8000").InFlight() == 3 })
	b.pool.SetPods([]datastore.EndpointSource{
		{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, UID: "a", IP: "127.0.0.2", Labels: map[string]string{"relabelled": "yes"}},
		{Pod: types.NamespacedName{Namespace: "ns", Name: "b"}, UID: "b", IP: "127.0.0.3"},
	})
	if e := b.endpoint(t, "127.0.0.2:8000"); e.Labels["relabelled"] != "yes" {
		t.Fatal("the endpoint was not relabelled")
	}
	count(3) // the peer's snapshot
	poll.Until(t, 10*time.Second, "the snapshot applied", func() bool { return applied() == 2 })
	if n := b.endpoint(t, "127.0.0.2:8000").InFlight(); n != 3 {
		t.Fatalf("in flight %d after a relabel, want 3", n)
	}
	count(0)
	poll.Until(t, 10*time.Second, "the zero applied", func() bool { return applied() == 3 })
	if n := b.endpoint(t, "127.0.0.2:8000").InFlight(); n != 0 {
		t.Fatalf("in flight %d after the peer's 0, want 0", n)
	}
	_ = ps.finish()
}

// TestSilentPeerExpires: a stream that sends nothing for PeerTimeout is
// ended and its counts taken back; a replica's stream with nothing to
// send stays, its heartbeats keeping it.
func TestSilentPeerExpires(t *testing.T) {
	b := newSide(t, Options{PeerTimeout: 300 * time.Millisecond})
	b.start(t)
	ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), b, testSecret, "silent")
	if ps.err != nil {
		t.Fatal(ps.err)
	}
	if err := ps.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: 3})); err != nil {
		t.Fatal(err)
	}
	eb := b.endpoint(t, "127.0.0.2:8000")
	poll.Until(t, 10*time.Second, "the silent peer's count", func() bool { return eb.InFlight() == 3 })
	// Nothing more is sent: the receiver ends the stream.
	if err := ps.answer(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the silent stream ended with %v, want DeadlineExceeded", err)
	}
	if eb.InFlight() != 0 {
		t.Fatalf("in flight %d after the silent peer's stream ended, want 0", eb.InFlight())
	}
	if n := testutil.ToFloat64(b.x.metrics.ended.WithLabelValues("silent")); n != 1 {
		t.Fatalf("%s{reason=silent} %v, want 1", MetricEnded, n)
	}

	// A replica that heartbeats every 50 ms: its stream outlives several
	// timeouts, as many heartbeats arriving as the clock allows.
	a := newSide(t, Options{HeartbeatInterval: 50 * time.Millisecond, Peers: func() []string { return []string{b.lis.Addr().String()} }})
	a.start(t)
	poll.Until(t, 10*time.Second, "the replica's stream", func() bool { return testutil.ToFloat64(b.x.metrics.streams) == 1 })
	start := time.Now()
	poll.Until(t, 30*time.Second, "four timeouts to pass", func() bool { return time.Since(start) > 4*300*time.Millisecond })
	if n := testutil.ToFloat64(b.x.metrics.ended.WithLabelValues("silent")); n != 1 || testutil.ToFloat64(b.x.metrics.streams) != 1 {
		t.Fatalf("%s{reason=silent} %v and %v streams: the heartbeating replica's stream was ended", MetricEnded, n, testutil.ToFloat64(b.x.metrics.streams))
	}
}

// TestPeerLeavesList: when a peer's address leaves the peer list, its
// streams end and its counts are taken back at once.
func TestPeerLeavesList(t *testing.T) {
	peers := make(chan []string, 1)
	peers <- []string{"127.0.0.1:1"}
	current := func() []string { l := <-peers; peers <- l; return l }
	b := newSide(t, Options{OnlyPeers: true, RefreshInterval: 20 * time.Millisecond, Peers: current})
	b.start(t)
	ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), b, testSecret, "leaving")
	if ps.err != nil {
		t.Fatal(ps.err)
	}
	if err := ps.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: 3})); err != nil {
		t.Fatal(err)
	}
	eb := b.endpoint(t, "127.0.0.2:8000")
	poll.Until(t, 10*time.Second, "the peer's count", func() bool { return eb.InFlight() == 3 })
	<-peers
	peers <- []string{"127.0.0.9:1"}
	if err := ps.answer(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the stream of a peer no longer listed ended with %v, want PermissionDenied", err)
	}
	if eb.InFlight() != 0 {
		t.Fatalf("in flight %d after the peer left the list, want 0", eb.InFlight())
	}
	if n := testutil.ToFloat64(b.x.metrics.ended.WithLabelValues("left-peer-list")); n != 1 {
		t.Fatalf("%s{reason=left-peer-list} %v, want 1", MetricEnded, n)
	}
}

// TestPanicEndsOneStream: a panic while applying a peer's record ends that
// stream with an error, counted and logged, and takes its counts back;
// the listener and the other streams go on.
func TestPanicEndsOneStream(t *testing.T) {
	b := newSide(t, Options{})
	learn := b.x.opts.Learner
	b.x.opts.Learner = LearnerFuncs{
		Learn: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
			if blocks[0] == 666 {
				panic("a learner failing on a peer's blocks")
			}
			learn.LearnPeerBlocks(pool, e, blocks)
		},
	}
	b.start(t)
	conn := dialFrom(t, b.lis.Addr().String(), "127.0.0.1")
	other := openPeerStream(t, conn, b, testSecret, "other")
	if other.err != nil {
		t.Fatal(other.err)
	}
	bad := openPeerStream(t, conn, b, testSecret, "bad")
	if bad.err != nil {
		t.Fatal(bad.err)
	}
	eb := b.endpoint(t, "127.0.0.2:8000")
	if err := bad.send(encodeFrame(record{kind: kindInFlight, pool: poolKey, addr: "127.0.0.2:8000", inFlight: 2})); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the count", func() bool { return eb.InFlight() == 2 })
	if err := bad.send(encodeFrame(record{kind: kindBlocks, pool: poolKey, addr: "127.0.0.2:8000", blocks: []uint64{666}})); err != nil {
		t.Fatal(err)
	}
	if err := bad.answer(); status.Code(err) != codes.Internal {
		t.Fatalf("the stream that made the receiver panic ended with %v, want Internal", err)
	}
	if n := testutil.ToFloat64(b.x.metrics.panics); n != 1 {
		t.Fatalf("%s %v, want 1", MetricPanics, n)
	}
	if eb.InFlight() != 0 {
		t.Fatalf("in flight %d after the stream's panic, want 0", eb.InFlight())
	}
	if err := other.send(encodeFrame(record{kind: kindBlocks, pool: poolKey, addr: "127.0.0.2:8000", blocks: []uint64{1}})); err != nil {
		t.Fatal(err)
	}
	if got := <-b.learned; got.blocks[0] != 1 {
		t.Fatalf("learned %+v on the other stream", got)
	}
	if err := other.finish(); err != nil {
		t.Fatal(err)
	}
}

// TestOthersShareOneAllowance: with OnlyPeers, the addresses that are no
// peer's share one allowance of connections, so that however many there
// are they hold a bounded number; a peer's connections are its own.
func TestOthersShareOneAllowance(t *testing.T) {
	b := newSide(t, Options{OnlyPeers: true, Peers: func() []string { return []string{"127.0.0.1:1"} }})
	b.start(t)
	codesSeen := map[codes.Code]int{}
	for i := range 2 * DefaultMaxConnectionsPerPeer {
		from := fmt.Sprintf("127.0.0.%d", 5+i%2)
		ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), from), b, testSecret, "other")
		codesSeen[status.Code(ps.err)]++
	}
	if codesSeen[codes.PermissionDenied] != DefaultMaxConnectionsPerPeer || codesSeen[codes.Unavailable] != DefaultMaxConnectionsPerPeer {
		t.Fatalf("answers %v to %d streams from two addresses that are no peer's, each on its own connection: want %d refused as no peer's and the rest closed with their connection",
			codesSeen, 2*DefaultMaxConnectionsPerPeer, DefaultMaxConnectionsPerPeer)
	}
	if n := testutil.ToFloat64(b.x.metrics.limited.WithLabelValues(otherHost, "connections")); n < float64(DefaultMaxConnectionsPerPeer) {
		t.Fatalf("%s{peer=other,limit=connections} %v, want at least %d", MetricLimited, n, DefaultMaxConnectionsPerPeer)
	}
	ps := openPeerStream(t, dialFrom(t, b.lis.Addr().String(), "127.0.0.1"), b, testSecret, "peer")
	if ps.err != nil {
		t.Fatalf("the peer's stream while others hold their allowance: %v", ps.err)
	}
	if err := ps.finish(); err != nil {
		t.Fatal(err)
	}
}
