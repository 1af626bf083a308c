// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
)

// The sending side: one stream per peer, opened once the peer proved it
// holds the key, carrying the frames and heartbeats.

// peer is the stream to one peer replica.
type peer struct {
	addr   string
	frames chan frame
	cancel func()
	// refused is set, under the exchange's mu, once the peer refused the
	// stream for good (it is this replica).
	refused bool
}

// send streams frames to p until ctx ends, redialling with backoff when
// the stream breaks.
func (x *Exchange) send(ctx context.Context, p *peer) {
	creds := insecure.NewCredentials()
	if x.opts.ClientTLS != nil {
		creds = credentials.NewTLS(x.opts.ClientTLS)
	}
	// Pings find a peer that vanished without closing the connection,
	// which the heartbeats alone would learn only when TCP gives up.
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: DefaultPeerTimeout, Timeout: DefaultPeerTimeout, PermitWithoutStream: true})}
	if x.opts.LocalIP != nil {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: x.opts.LocalIP}}
		dialOpts = append(dialOpts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	conn, err := grpc.NewClient(p.addr, dialOpts...)
	if err != nil {
		x.opts.Logger.Error(err, "peer sync: bad peer address", "peer", p.addr)
		return
	}
	defer conn.Close()
	backoff := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Cap: 2 * time.Second, Steps: math.MaxInt32}
	for ctx.Err() == nil {
		err := x.stream(ctx, conn, p)
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.FailedPrecondition {
			// This replica itself, a peer of another version or one keyed
			// differently: retrying would not change the answer. It is
			// asked again once it leaves the peer list and comes back.
			if msg := status.Convert(err).Message(); strings.Contains(msg, keyMismatch) {
				x.opts.Logger.Error(err, "peer sync: not streaming to a peer of another hash key; its routing and this replica's do not follow each other", "peer", p.addr)
			} else {
				x.opts.Logger.V(2).Info("peer sync: not streaming to a peer", "peer", p.addr, "err", msg)
			}
			x.mu.Lock()
			p.refused = true
			x.countPeers()
			x.mu.Unlock()
			<-ctx.Done()
			return
		}
		retry := backoff.Step()
		x.opts.Logger.V(2).Info("peer sync stream ended; retrying", "peer", p.addr, "err", err, "backoff", retry)
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// stream opens one stream to p and sends on it once p proved it holds the
// Secret (auth.go): this replica's proof, then the in-flight snapshot, so
// a peer (re)connected is right at once, then the frames, with an empty
// one when there was nothing to send for a HeartbeatInterval.
func (x *Exchange) stream(ctx context.Context, conn *grpc.ClientConn, p *peer) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nonce, err := newNonce()
	if err != nil {
		return err
	}
	sctx = metadata.AppendToOutgoingContext(sctx, idHeader, x.id, keyHeader, x.keyPrint, nonceHeader, nonce)
	s, err := wirepb.NewPeerSyncClient(conn).Push(sctx, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	// The server answers at once when it refuses the stream; headers
	// come first otherwise (serve sends them before reading).
	md, err := s.Header()
	if err != nil {
		return err
	}
	if md == nil {
		// Trailers only: the server refused; RecvMsg says why.
		return s.RecvMsg(&wirepb.Sealed{})
	}
	sess, err := x.verifyReceiver(s.Context(), md, nonce)
	if err != nil {
		x.metrics.unverified.Inc()
		x.opts.Logger.Error(err, "peer sync: not streaming to a peer that did not authenticate", "peer", p.addr)
		return err
	}
	forget := slices.Contains(md.Get(forgetHeader), "1")
	if err := s.SendMsg(&wirepb.Sealed{Value: sess.proof(roleDialler)}); err != nil {
		return err
	}
	x.mu.Lock()
	var recs []record
	for e, pool := range x.reported {
		recs = append(recs, record{kind: kindInFlight, pool: pool, addr: e.Address, inFlight: e.OwnInFlight()})
	}
	x.mu.Unlock()
	for _, f := range x.encode(recs) {
		if err := s.SendMsg(&wirepb.Sealed{Value: sess.seal(f)}); err != nil {
			return err
		}
	}
	// Ticks at half the interval: a tick after one with nothing sent
	// sends, so frames are at most HeartbeatInterval apart.
	heartbeat := time.NewTicker(x.opts.HeartbeatInterval / 2)
	defer heartbeat.Stop()
	sent := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-heartbeat.C:
			if sent {
				sent = false
				continue
			}
			if err := s.SendMsg(&wirepb.Sealed{Value: sess.seal(frameHeader)}); err != nil {
				return err
			}
			sent = true
		case f := <-p.frames:
			if f.forget && !forget {
				continue // a peer of the release before: it would refuse the frame
			}
			if err := s.SendMsg(&wirepb.Sealed{Value: sess.seal(f.b)}); err != nil {
				return err
			}
			sent = true
		}
	}
}

// verifyReceiver checks the proof in the receiver's headers md of the
// stream of ctx, opened with nonce, and returns the stream's session.
func (x *Exchange) verifyReceiver(ctx context.Context, md metadata.MD, nonce string) (*session, error) {
	ids, nonces, proofs := md.Get(idHeader), md.Get(nonceHeader), md.Get(proofHeader)
	if len(ids) != 1 || len(nonces) != 1 || len(proofs) != 1 || !validNonce(nonces[0]) {
		return nil, fmt.Errorf("%w: its answer carries no proof (a replica of a release before authentication, or no replica)", errUnauthenticated)
	}
	binding, err := channelBinding(ctx)
	if err != nil {
		return nil, err
	}
	if binding == nil && x.opts.ClientTLS != nil {
		return nil, fmt.Errorf("%w: no TLS session to bind the proof to", errUnauthenticated)
	}
	sess := newSession(x.opts.Secret, nonce, x.id, nonces[0], ids[0], binding)
	proof, err := hex.DecodeString(proofs[0])
	if err != nil || !sess.checkProof(roleReceiver, proof) {
		return nil, fmt.Errorf("%w: its proof does not match this replica's key (another --peer-sync-key-file, or no replica)", errUnauthenticated)
	}
	return sess, nil
}
