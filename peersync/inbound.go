// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
)

// idHeader carries the sending exchange's id.
const idHeader = "poolpicker-peer-sync-id"

// forgetHeader, "1" in a receiver's headers, says it reads forget records.
const forgetHeader = "poolpicker-peer-sync-forget"

// keyHeader carries the sender's key fingerprint (keyFingerprint).
const keyHeader = "poolpicker-peer-sync-key"

// keyMismatch begins the refusal of a stream keyed differently.
const keyMismatch = "peer sync: the peer hashes prompt blocks with another key"

// maxIDBytes bounds a sender's id (New makes them of 16 hex digits).
const maxIDBytes = 64

// otherHost labels the metrics of an address that is no peer's.
const otherHost = "other"

// pushService serves the PeerSync service of wirepb.
type pushService struct {
	wirepb.UnimplementedPeerSyncServer
	x *Exchange
}

func (p pushService) Push(s grpc.ClientStreamingServer[wirepb.Sealed, wirepb.Sealed]) error {
	return p.x.serve(s)
}

// inbound is what the peers' streams have brought and the limits they are
// held to; its mu is never held with the exchange's.
type inbound struct {
	mu sync.Mutex
	// peerHosts are the peers' IPs (OnlyPeers).
	peerHosts map[string]bool
	// hosts are the addresses with connections or streams open, and the
	// peers' (whose record budgets persist across reconnections).
	hosts map[string]*hostState
	// senders are the replicas (by their id) with a stream open.
	senders map[string]*sender
	// totals is the sum of the senders' counts per endpoint: what
	// datastore.Endpoint.SetPeerInFlight is given, bounded.
	totals map[countKey]int64
}

func newInbound() inbound {
	return inbound{peerHosts: map[string]bool{}, hosts: map[string]*hostState{}, senders: map[string]*sender{}, totals: map[countKey]int64{}}
}

// hostState is one address's connections, streams and record budget.
type hostState struct {
	conns, streams int
	// records admits MaxRecordsPerSecond records, as deep a burst, shared
	// by the address's streams.
	records *rate.Limiter
	// gone is closed when the address leaves the peer list: its streams
	// end.
	gone chan struct{}
}

// sender is a peer replica with a stream open, and the in-flight counts
// it last said it has, by endpoint.
type sender struct {
	streams int
	counts  map[countKey]int64
}

// countKey names an endpoint as the peers do: a pool and an address. A
// relabelled pod keeps its address, so its count is not counted twice.
type countKey struct {
	pool datastore.PoolKey
	addr string
}

// setPeerHosts replaces the peers' addresses; the streams of an address
// no longer among them end.
func (x *Exchange) setPeerHosts(hosts map[string]bool) {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	for h := range in.peerHosts {
		if hosts[h] {
			continue
		}
		if hs := in.hosts[h]; hs != nil {
			close(hs.gone)
			hs.gone = make(chan struct{})
			in.forgetHostLocked(h)
		}
	}
	in.peerHosts = hosts
}

// hostLocked returns host's state, made on first use.
func (x *Exchange) hostLocked(host string) *hostState {
	in := &x.in
	hs := in.hosts[host]
	if hs == nil {
		hs = &hostState{records: rate.NewLimiter(rate.Limit(x.opts.MaxRecordsPerSecond), x.opts.MaxRecordsPerSecond), gone: make(chan struct{})}
		in.hosts[host] = hs
	}
	return hs
}

// forgetHostLocked drops the state of host once nothing of it is open and
// it is no peer's (whose record budget outlives its connections).
func (in *inbound) forgetHostLocked(host string) {
	if hs := in.hosts[host]; hs != nil && hs.conns == 0 && hs.streams == 0 && !in.peerHosts[host] {
		delete(in.hosts, host)
	}
}

// label is host as the metrics name it: a peer's IP, or otherHost.
func (x *Exchange) label(host string) string {
	x.in.mu.Lock()
	defer x.in.mu.Unlock()
	if host != otherHost && x.in.peerHosts[host] {
		return host
	}
	return otherHost
}

// limited counts a refusal or drop at limit for host.
func (x *Exchange) limited(host, limit string) {
	x.metrics.limited.WithLabelValues(x.label(host), limit).Inc()
}

// hostOf is the IP an address is from.
func hostOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// limitedListener closes a connection beyond MaxConnectionsPerPeer from
// its address as soon as it is accepted. With OnlyPeers, the addresses
// that are no peer's share one such allowance (their streams are refused
// anyway), so that however many there are they hold a bounded number.
type limitedListener struct {
	net.Listener
	x *Exchange
}

func (l *limitedListener) Accept() (net.Conn, error) {
	x := l.x
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		x.in.mu.Lock()
		if x.opts.OnlyPeers && !x.in.peerHosts[host] {
			host = otherHost
		}
		hs := x.hostLocked(host)
		ok := hs.conns < x.opts.MaxConnectionsPerPeer
		if ok {
			hs.conns++
		} else {
			x.in.forgetHostLocked(host)
		}
		x.in.mu.Unlock()
		if !ok {
			// Counted before the close, so that whoever sees the close
			// finds it counted.
			x.limited(host, "connections")
			_ = c.Close()
			continue
		}
		return &countedConn{Conn: c, x: x, host: host}, nil
	}
}

// countedConn gives its place back when closed.
type countedConn struct {
	net.Conn
	x    *Exchange
	host string
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		in := &c.x.in
		in.mu.Lock()
		defer in.mu.Unlock()
		if hs := in.hosts[c.host]; hs != nil {
			hs.conns--
			in.forgetHostLocked(c.host)
		}
	})
	return err
}

// refuse counts a refused stream and returns its error.
func (x *Exchange) refuse(reason string, code codes.Code, format string, args ...any) error {
	x.metrics.refused.WithLabelValues(reason).Inc()
	return status.Errorf(code, format, args...)
}

// Why serve ended a stream from its side.
var (
	errSilent = errors.New("peer sync: the peer sent nothing for the peer timeout")
	errGone   = errors.New("peer sync: the peer left the peer list")
)

// serve applies one peer's stream until it ends. Nothing the stream sends
// is applied before its sender proved it holds the Secret; its address is
// held to the per-peer limits; the stream ends when it is silent for
// PeerTimeout or its address leaves the peer list, and then, unless the
// sender has another stream open, the in-flight counts it reported are
// taken back. A panic ends this stream only.
func (x *Exchange) serve(s grpc.ServerStream) (err error) {
	ctx := s.Context()
	var host string
	if p, ok := grpcpeer.FromContext(ctx); ok {
		host = hostOf(p.Addr)
	}
	defer func() {
		if r := recover(); r != nil {
			x.metrics.panics.Inc()
			x.opts.Logger.Error(fmt.Errorf("%v", r), "peer sync: a panic while applying a peer's stream; the stream is ended", "peer", host, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "peer sync: the receiver failed on this stream")
		}
	}()
	if x.opts.OnlyPeers && !x.fromPeer(host) {
		return x.refuse("not-a-peer", codes.PermissionDenied, "peer sync: not a peer replica")
	}
	got, _ := metadata.FromIncomingContext(ctx)
	ids := got.Get(idHeader)
	if slices.Contains(ids, x.id) {
		return status.Error(codes.FailedPrecondition, "peer sync: a stream from this replica to itself")
	}
	keys, nonces := got.Get(keyHeader), got.Get(nonceHeader)
	if len(keys) == 0 || len(nonces) != 1 || !validNonce(nonces[0]) || len(ids) != 1 || len(ids[0]) == 0 || len(ids[0]) > maxIDBytes {
		return x.refuse("unauthenticated", codes.Unauthenticated, "peer sync: a stream without the key's fingerprint, a nonce and an id is refused (a replica of a release before authentication, or no replica)")
	}
	if keys[0] != x.keyPrint {
		// Its blocks would never match this replica's: refused at once,
		// not applied to nothing, so that both ends say so.
		x.metrics.keyMismatch.Inc()
		err := status.Errorf(codes.FailedPrecondition, "%s (fingerprint %.16q, this replica's %s): give every replica the same --peer-sync-key-file", keyMismatch, keys[0], x.keyPrint)
		x.opts.Logger.Error(err, "peer sync: refused a peer's stream", "peer", host)
		return err
	}
	gone, ok := x.openStream(host)
	if !ok {
		x.limited(host, "streams")
		return x.refuse("limit", codes.ResourceExhausted, "peer sync: %d streams open from %s, at most %d (--peer-sync-max-streams-per-peer)", x.opts.MaxStreamsPerPeer, host, x.opts.MaxStreamsPerPeer)
	}
	defer x.closeStream(host)
	binding, err := channelBinding(ctx)
	if err != nil || (binding == nil && x.opts.ServerTLS != nil) {
		return x.refuse("unauthenticated", codes.Unauthenticated, "peer sync: no TLS session to bind the proof to: %v", err)
	}
	nonce, err := newNonce()
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	sess := newSession(x.opts.Secret, nonces[0], ids[0], nonce, x.id, binding)
	md := metadata.Pairs(idHeader, x.id, nonceHeader, nonce, proofHeader, hex.EncodeToString(sess.proof(roleReceiver)))
	if !x.legacy {
		md.Set(forgetHeader, "1")
	}
	if err := s.SendHeader(md); err != nil {
		return nil
	}

	// The messages are read on a goroutine of their own, so that a stream
	// that sends nothing is ended here; it ends with the stream.
	msgs, errs, done := make(chan []byte), make(chan error, 1), make(chan struct{})
	defer close(done)
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		for {
			var m wirepb.Sealed
			if err := s.RecvMsg(&m); err != nil {
				errs <- err
				return
			}
			select {
			case msgs <- m.Value:
			case <-done:
				return
			}
		}
	}()
	silence := time.NewTimer(x.opts.PeerTimeout)
	defer silence.Stop()
	next := func() ([]byte, error) {
		select {
		case b := <-msgs:
			silence.Reset(x.opts.PeerTimeout)
			return b, nil
		case err := <-errs:
			return nil, err
		case <-silence.C:
			x.metrics.ended.WithLabelValues("silent").Inc()
			return nil, errSilent
		case <-gone:
			x.metrics.ended.WithLabelValues("left-peer-list").Inc()
			return nil, errGone
		}
	}

	proof, err := next()
	if err != nil {
		return x.ended(s, err)
	}
	if !sess.checkProof(roleDialler, proof) {
		// Counted; logged at V(2) only, as whoever reaches the port can
		// open such streams.
		x.opts.Logger.V(2).Info("peer sync: refused a stream without a valid proof of the key", "peer", host)
		return x.refuse("unauthenticated", codes.Unauthenticated, "peer sync: %v", errUnauthenticated)
	}

	id := ids[0]
	x.openSender(id)
	defer x.closeSender(id)
	x.metrics.streams.Inc()
	defer x.metrics.streams.Dec()
	apply := func(r *record) { x.apply(host, id, r) }
	for {
		msg, err := next()
		if err != nil {
			return x.ended(s, err)
		}
		if len(msg) > x.opts.MaxFrameBytes+tagBytes {
			x.metrics.dropped.WithLabelValues("malformed").Inc()
			return fmt.Errorf("peer sync: frame of %d bytes, at most %d", len(msg)-tagBytes, x.opts.MaxFrameBytes)
		}
		frame, err := sess.open(msg)
		if err != nil {
			x.metrics.dropped.WithLabelValues("malformed").Inc()
			return x.refuse("unauthenticated", codes.Unauthenticated, "peer sync: %v", err)
		}
		if err := decodeFrame(frame, apply); err != nil {
			x.metrics.dropped.WithLabelValues("malformed").Inc()
			x.opts.Logger.V(2).Info("peer sync: malformed frame; the stream is closed", "peer", host, "err", err.Error())
			return fmt.Errorf("peer sync: %w", err)
		}
	}
}

// ended is serve's answer on s when next failed with err.
func (x *Exchange) ended(s grpc.ServerStream, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		// The sender closed its side: the one message the method answers.
		return s.SendMsg(&wirepb.Sealed{})
	case errors.Is(err, errSilent):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, errGone):
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// fromPeer reports whether host is one of the peers'.
func (x *Exchange) fromPeer(host string) bool {
	x.in.mu.Lock()
	defer x.in.mu.Unlock()
	return x.in.peerHosts[host]
}

// openStream takes one of host's stream places, and returns the channel
// closed when host leaves the peer list; false when it has none free.
func (x *Exchange) openStream(host string) (<-chan struct{}, bool) {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	hs := x.hostLocked(host)
	if hs.streams >= x.opts.MaxStreamsPerPeer {
		return nil, false
	}
	hs.streams++
	var gone <-chan struct{}
	if x.opts.OnlyPeers {
		gone = hs.gone
	}
	return gone, true
}

func (x *Exchange) closeStream(host string) {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	if hs := in.hosts[host]; hs != nil {
		hs.streams--
		in.forgetHostLocked(host)
	}
}

// openSender notes a stream of the replica id.
func (x *Exchange) openSender(id string) {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	snd := in.senders[id]
	if snd == nil {
		snd = &sender{counts: map[countKey]int64{}}
		in.senders[id] = snd
	}
	snd.streams++
}

// closeSender notes the end of a stream of the replica id: with its last,
// the counts it reported are taken back.
func (x *Exchange) closeSender(id string) {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	snd := in.senders[id]
	if snd == nil {
		return
	}
	if snd.streams--; snd.streams > 0 {
		return
	}
	delete(in.senders, id)
	for k, n := range snd.counts {
		x.addTotalLocked(k, -n, nil)
	}
}

// addTotalLocked adds d to the peers' count on k and sets the bounded sum
// on the endpoint: e, or the one the registry has at k.
func (x *Exchange) addTotalLocked(k countKey, d int64, e *datastore.Endpoint) {
	in := &x.in
	t := in.totals[k] + d
	if t <= 0 {
		delete(in.totals, k)
		t = 0
	} else {
		in.totals[k] = t
	}
	if e == nil {
		pool, ok := x.opts.Registry.Get(k.pool)
		if !ok {
			return
		}
		if e, ok = pool.Endpoints().Get(k.addr); !ok {
			return
		}
	}
	e.SetPeerInFlight(min(t, int64(x.opts.MaxInFlightPerEndpoint)))
}

// take spends one of host's record tokens; false when it has none.
func (x *Exchange) take(host string) bool {
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	return x.hostLocked(host).records.Allow()
}

// apply applies a record of the replica id's, from host.
func (x *Exchange) apply(host, id string, r *record) {
	if !x.take(host) {
		x.metrics.dropped.WithLabelValues("rate").Inc()
		x.limited(host, "records")
		return
	}
	var e *datastore.Endpoint
	pool, ok := x.opts.Registry.Get(r.pool)
	if ok {
		e, ok = pool.Endpoints().Get(r.addr)
	}
	if r.kind == kindInFlight {
		x.applyInFlight(host, id, r, e)
	}
	if !ok {
		x.metrics.dropped.WithLabelValues("unknown").Inc()
		return
	}
	x.metrics.received.WithLabelValues(kindName(r.kind)).Inc()
	switch r.kind {
	case kindBlocks:
		x.opts.Learner.LearnPeerBlocks(pool, e, r.blocks)
	case kindForget:
		x.opts.Learner.ForgetPeerBlocks(pool, e, r.blocks)
	}
}

// applyInFlight records what the replica id says it has in flight on the
// record's endpoint (e, nil when this replica has none there: a count
// back at zero is still taken back), bounded by MaxInFlightPerEndpoint.
func (x *Exchange) applyInFlight(host, id string, r *record, e *datastore.Endpoint) {
	n := r.inFlight
	if limit := int64(x.opts.MaxInFlightPerEndpoint); n > limit {
		n = limit
		x.limited(host, "in-flight")
	}
	if e == nil && n > 0 {
		return
	}
	in := &x.in
	in.mu.Lock()
	defer in.mu.Unlock()
	snd := in.senders[id]
	if snd == nil {
		return
	}
	k := countKey{pool: r.pool, addr: r.addr}
	prev := snd.counts[k]
	if n == 0 {
		delete(snd.counts, k)
	} else {
		snd.counts[k] = n
	}
	// Set even when unchanged: the endpoint may be a new one at the same
	// address (its pod gone unready and back), which starts at zero.
	x.addTotalLocked(k, n-prev, e)
}
func kindName(k byte) string {
	switch k {
	case kindBlocks:
		return "blocks"
	case kindForget:
		return "forget"
	}
	return "in-flight"
}
