// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package peersync streams what each picker replica learns from its picks
// (the prompt blocks an endpoint now caches, those its server's reports
// said it no longer caches, and the requests it has in flight there) to
// its peer replicas over long-lived gRPC streams, off the pick path, so
// that every replica's prefix index and load view follow every replica's
// picks, as one replica's follow its own.
package peersync

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/peersync/internal/wirepb"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Learner is what learns from the peers: the scheduler, whose prefix
// plugins record a peer's blocks as their own pick would, and forget the
// blocks a peer's server report said an endpoint no longer has.
type Learner interface {
	LearnPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
	ForgetPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
}

// Defaults of Options.
const (
	DefaultFlushInterval       = 2 * time.Millisecond
	DefaultSnapshotInterval    = time.Second
	DefaultRefreshInterval     = 2 * time.Second
	DefaultQueueRecords        = 1 << 14
	DefaultMaxRecordsPerSecond = 1 << 15
	DefaultMaxFrameBytes       = 1 << 20
	// DefaultMaxConnectionsPerPeer and DefaultMaxStreamsPerPeer leave
	// room for a replica's one stream and its reconnection (the old one
	// not yet seen gone), and for a few replicas behind one address.
	DefaultMaxConnectionsPerPeer = 4
	DefaultMaxStreamsPerPeer     = 4
	// DefaultMaxInFlightPerEndpoint is more than a model server runs and
	// queues at once (vLLM runs at most 256 or 1024 sequences by default).
	DefaultMaxInFlightPerEndpoint = 1024
	// DefaultHeartbeatInterval is how often a sender with nothing to send
	// sends an empty frame; DefaultPeerTimeout how long a receiver waits
	// for a frame before it ends the stream and takes its counts back.
	DefaultHeartbeatInterval = time.Second
	DefaultPeerTimeout       = 5 * time.Second
)

// Options configure an Exchange; zero fields take the defaults above.
type Options struct {
	// Registry is where a peer's records find their pool and endpoint; a
	// record naming neither here is dropped.
	Registry *datastore.Registry
	// Learner hears of the peers' blocks, learned and forgotten.
	Learner Learner
	// HashKey keys the block hashes (framework.Peers.HashKey): every
	// replica of a deployment must have the same.
	HashKey uint64
	// Listener serves the peers' streams. Nil: Start listens on Addr, or,
	// without it, this replica only sends.
	Listener net.Listener
	// Addr is the host:port Start listens on when Listener is nil.
	Addr string
	// Peers returns the addresses (host:port) of the peer replicas to send
	// to, without this one's own; asked every RefreshInterval.
	Peers func() []string
	// Secret authenticates the replicas to each other (the content of a
	// mounted Secret, the same in every replica; at least MinSecretBytes):
	// a stream is applied only once its sender proved it holds it, and
	// sent to only once its receiver did (see auth.go).
	Secret []byte
	// OnlyPeers accepts streams only from the hosts of Peers' addresses
	// (their IPs, as the connection's source; a name is resolved): another
	// pod that can reach the port is refused before it sends anything,
	// and a host that leaves the list has its streams ended.
	OnlyPeers bool
	// Resolver resolves the names among Peers' hosts. Nil: the system's.
	Resolver *net.Resolver
	// LocalIP, when set, is the source address the streams to peers dial
	// from (the replica's bind address), so that a peer with OnlyPeers
	// knows it.
	LocalIP net.IP
	// ServerTLS, when set, is the listener's TLS (ask for and verify
	// client certificates there: a peer is anyone who can connect).
	// ClientTLS is the TLS the streams to peers dial with. Nil: plaintext
	// (loopback tests and benchmarks).
	ServerTLS, ClientTLS *tls.Config
	// FlushInterval is how long records gather before they are sent: the
	// delay a peer learns a pick with, at most, beyond the network's.
	FlushInterval time.Duration
	// SnapshotInterval is how often every nonzero in-flight count is sent
	// again, so a peer that missed an update or connected late is right
	// within it.
	SnapshotInterval time.Duration
	// RefreshInterval is how often Peers is asked.
	RefreshInterval time.Duration
	// QueueRecords bounds the records waiting to be sent; beyond it a
	// pick's blocks are dropped (and counted).
	QueueRecords int
	// MaxRecordsPerSecond bounds what one peer (all the streams from its
	// address) may deliver; beyond it records are dropped (and counted), so
	// a peer gone wild costs bounded work.
	MaxRecordsPerSecond int
	// MaxConnectionsPerPeer bounds the connections open from one address;
	// beyond it a connection is closed at once (and counted).
	MaxConnectionsPerPeer int
	// MaxStreamsPerPeer bounds the streams open from one address, over
	// all its connections; beyond it a stream is refused (and counted).
	MaxStreamsPerPeer int
	// MaxInFlightPerEndpoint bounds what one peer may say it has in flight
	// on an endpoint, and what all the peers together count there, so that
	// a peer gone wrong can make an endpoint look at most as busy as a
	// server can plausibly be.
	MaxInFlightPerEndpoint int
	// HeartbeatInterval is how often a stream with nothing to carry sends
	// an empty frame, so that its receiver knows it is alive.
	HeartbeatInterval time.Duration
	// PeerTimeout is how long a stream may be silent: beyond it the
	// receiver ends it, and takes the sender's in-flight counts back
	// unless the sender has another stream open. Longer than the peers'
	// HeartbeatInterval.
	PeerTimeout time.Duration
	// MaxFrameBytes bounds a frame, both ways.
	MaxFrameBytes int
	Logger        logr.Logger
	// Registerer is where the exchange's metrics go. Nil: nowhere.
	Registerer prometheus.Registerer
}

func (o *Options) setDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.FlushInterval, DefaultFlushInterval)
	def(&o.SnapshotInterval, DefaultSnapshotInterval)
	def(&o.RefreshInterval, DefaultRefreshInterval)
	def(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&o.PeerTimeout, DefaultPeerTimeout)
	for _, v := range []struct {
		p *int
		d int
	}{{&o.QueueRecords, DefaultQueueRecords}, {&o.MaxRecordsPerSecond, DefaultMaxRecordsPerSecond}, {&o.MaxFrameBytes, DefaultMaxFrameBytes},
		{&o.MaxConnectionsPerPeer, DefaultMaxConnectionsPerPeer}, {&o.MaxStreamsPerPeer, DefaultMaxStreamsPerPeer}, {&o.MaxInFlightPerEndpoint, DefaultMaxInFlightPerEndpoint}} {
		if *v.p <= 0 {
			*v.p = v.d
		}
	}
	o.MaxInFlightPerEndpoint = min(o.MaxInFlightPerEndpoint, MaxInFlightBound)
	if o.Peers == nil {
		o.Peers = func() []string { return nil }
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
}

// Exchange is one replica's end of the peer streams: it implements
// framework.Peers for the scheduler, hears of its in-flight changes
// (InFlightChanged), sends both to every peer, and applies what the peers
// send.
type Exchange struct {
	opts Options
	// id tells this exchange's streams apart from a peer's: a replica
	// whose peer list names itself refuses its own stream.
	id string
	// keyPrint names HashKey without giving it away, so that two replicas
	// keyed differently, whose blocks would never match, find out.
	keyPrint string
	metrics  *metrics
	kick     chan struct{}

	mu       sync.Mutex
	pending  []record
	dirty    map[*datastore.Endpoint]datastore.PoolKey
	reported map[*datastore.Endpoint]datastore.PoolKey // sent nonzero since the last snapshot
	peers    map[string]*peer
	// resolved is the last answer for each name among the peers' hosts,
	// kept when a lookup fails (read and written by Start's goroutine).
	resolved map[string][]string

	// in is what the peers' streams have brought (inbound.go).
	in inbound
	// wg counts the goroutines Start waits for.
	wg sync.WaitGroup

	// legacy makes serve answer as the release before forget records did
	// (no forgetHeader): what a replica of that release does in a rolling
	// update, for the tests.
	legacy bool
}

var _ framework.Peers = (*Exchange)(nil)

// New returns an Exchange; Start runs it.
func New(opts Options) (*Exchange, error) {
	opts.setDefaults()
	if opts.Registry == nil || opts.Learner == nil {
		return nil, errors.New("peersync: a Registry and a Learner are needed")
	}
	if len(opts.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("peersync: a Secret of at least %d bytes is needed to authenticate the peers, got %d", MinSecretBytes, len(opts.Secret))
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	return &Exchange{opts: opts, id: hex.EncodeToString(id[:]), keyPrint: keyFingerprint(opts.HashKey), metrics: m, kick: make(chan struct{}, 1),
		dirty: map[*datastore.Endpoint]datastore.PoolKey{}, reported: map[*datastore.Endpoint]datastore.PoolKey{}, peers: map[string]*peer{},
		resolved: map[string][]string{}, in: newInbound()}, nil
}

// HashKey implements framework.Peers.
func (x *Exchange) HashKey() uint64 { return x.opts.HashKey }

// keyFingerprint is the first 8 bytes of a SHA-256 of the key, in hex: the
// same on replicas of the same key, and no help to whoever reads it in
// finding the key (that takes a search of all 2^64 keys).
func keyFingerprint(key uint64) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], key)
	sum := sha256.Sum256(append([]byte("poolpicker peer sync key\x00"), b[:]...))
	return hex.EncodeToString(sum[:8])
}

// ShareBlocks implements framework.Peers.
func (x *Exchange) ShareBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	x.queueBlocks(kindBlocks, pool, e, blocks)
}

// ForgetBlocks implements framework.Peers: at most MaxBlocksPerRecord
// blocks, the first ones given, go.
func (x *Exchange) ForgetBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	x.queueBlocks(kindForget, pool, e, blocks)
}

// queueBlocks queues a record of blocks for the next flush.
func (x *Exchange) queueBlocks(kind byte, pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	r := record{kind: kind, pool: pool.Key(), addr: e.Address(), blocks: slices.Clone(blocks[:min(len(blocks), MaxBlocksPerRecord)])}
	if !validRecord(&r) {
		return
	}
	x.mu.Lock()
	if len(x.pending) >= x.opts.QueueRecords {
		x.mu.Unlock()
		x.metrics.dropped.WithLabelValues("queue").Inc()
		return
	}
	x.pending = append(x.pending, r)
	x.mu.Unlock()
	x.wake()
}

// InFlightChanged tells the exchange that this replica's count of
// requests in flight on e (of pool) changed: the count as it is when the
// records are sent goes to the peers, so changes in between coalesce.
func (x *Exchange) InFlightChanged(pool *datastore.Pool, e *datastore.Endpoint) {
	if pool == nil || e == nil {
		return
	}
	x.mu.Lock()
	x.dirty[e] = pool.Key
	x.mu.Unlock()
	x.wake()
}

func (x *Exchange) wake() {
	select {
	case x.kick <- struct{}{}:
	default:
	}
}

// Start serves the peers' streams and sends to the peers until ctx ends;
// every goroutine it started has ended when it returns.
func (x *Exchange) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if x.opts.Listener == nil && x.opts.Addr != "" {
		lis, err := net.Listen("tcp", x.opts.Addr)
		if err != nil {
			return fmt.Errorf("peer sync: %w", err)
		}
		x.opts.Listener = lis
	}
	wg := &x.wg
	// The peers are known before the first stream is accepted (OnlyPeers).
	x.syncPeers(ctx, wg)
	var srv *grpc.Server
	if x.opts.Listener != nil {
		creds := insecure.NewCredentials()
		if x.opts.ServerTLS != nil {
			creds = credentials.NewTLS(x.opts.ServerTLS)
		}
		// Stop waits for the handlers, so that none starts a goroutine
		// once wg is waited on.
		// Keepalive closes the connection of a peer that vanished (its
		// place then counts no more against its address), and lets the
		// peers' pings through (see send).
		srv = grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(x.opts.MaxFrameBytes+tagBytes+64),
			grpc.MaxConcurrentStreams(uint32(x.opts.MaxStreamsPerPeer)), grpc.WaitForHandlers(true),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: x.opts.PeerTimeout, Timeout: x.opts.PeerTimeout}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: DefaultHeartbeatInterval, PermitWithoutStream: true}))
		wirepb.RegisterPeerSyncServer(srv, pushService{x: x})
		lis := &limitedListener{Listener: x.opts.Listener, x: x}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				x.opts.Logger.Error(err, "peer sync listener stopped")
			}
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); x.flushLoop(ctx) }()

	refresh := time.NewTicker(x.opts.RefreshInterval)
	defer refresh.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-refresh.C:
			x.syncPeers(ctx, wg)
		}
	}
	if srv != nil {
		srv.Stop()
	}
	x.mu.Lock()
	for addr, p := range x.peers {
		p.cancel()
		delete(x.peers, addr)
	}
	x.mu.Unlock()
	wg.Wait()
	return nil
}

// syncPeers starts a sender for each new peer and stops those gone, and
// tells the inbound side the peers' hosts (their IPs, names resolved).
func (x *Exchange) syncPeers(ctx context.Context, wg *sync.WaitGroup) {
	want, hosts := map[string]bool{}, map[string]bool{}
	names := map[string]bool{}
	for _, a := range x.opts.Peers() {
		want[a] = true
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			hosts[ip.String()] = true
			continue
		}
		names[h] = true
		for _, ip := range x.resolve(ctx, h) {
			hosts[ip] = true
		}
	}
	for name := range x.resolved {
		if !names[name] {
			delete(x.resolved, name)
		}
	}
	x.setPeerHosts(hosts)
	x.mu.Lock()
	defer x.mu.Unlock()
	for addr, p := range x.peers {
		if !want[addr] {
			p.cancel()
			delete(x.peers, addr)
		}
	}
	for addr := range want {
		if x.peers[addr] != nil {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peer{addr: addr, frames: make(chan frame, 256), cancel: cancel}
		x.peers[addr] = p
		wg.Add(1)
		go func() { defer wg.Done(); x.send(pctx, p) }()
	}
	x.countPeers()
}

// resolveTimeout bounds a lookup of a peer's name.
const resolveTimeout = 2 * time.Second

// resolve returns the IPs of name, or, when the lookup fails, those it had
// last.
func (x *Exchange) resolve(ctx context.Context, name string) []string {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := x.opts.Resolver.LookupHost(ctx, name)
	if err != nil {
		x.opts.Logger.V(2).Info("peer sync: a peer's name did not resolve; keeping its last addresses", "peer", name, "err", err.Error(), "addresses", x.resolved[name])
		return x.resolved[name]
	}
	ips := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip.String())
		}
	}
	x.resolved[name] = ips
	return ips
}

// countPeers sets the peers gauge: the peers streamed to, not those that
// refused (this replica itself). Called with mu held.
func (x *Exchange) countPeers() {
	n := 0
	for _, p := range x.peers {
		if !p.refused {
			n++
		}
	}
	x.metrics.peers.Set(float64(n))
}

// flushLoop sends the gathered records when there are some, at most every
// FlushInterval, and the in-flight snapshot every SnapshotInterval.
func (x *Exchange) flushLoop(ctx context.Context) {
	snap := time.NewTicker(x.opts.SnapshotInterval)
	defer snap.Stop()
	batch := time.NewTimer(0)
	<-batch.C
	for {
		select {
		case <-ctx.Done():
			batch.Stop()
			return
		case <-snap.C:
			x.fanOut(framesOf(x.snapshotFrames(), false))
			continue
		case <-x.kick:
		}
		batch.Reset(x.opts.FlushInterval)
		select {
		case <-ctx.Done():
			batch.Stop()
			return
		case <-batch.C:
		}
		x.fanOut(x.pendingFrames())
	}
}

// pendingFrames takes the gathered records and encodes them: the forget
// records in frames of their own, which go only to the peers that read
// them.
func (x *Exchange) pendingFrames() []frame {
	x.mu.Lock()
	recs := x.pending
	x.pending = nil
	for e, pool := range x.dirty {
		recs = append(recs, record{kind: kindInFlight, pool: pool, addr: e.Address, inFlight: e.OwnInFlight()})
		x.reported[e] = pool
		delete(x.dirty, e)
	}
	x.mu.Unlock()
	// In order, so that a peer forgets and learns a block as this replica
	// did: each run of forget records, and each run of others, is framed
	// on its own.
	var frames []frame
	for len(recs) > 0 {
		forget := recs[0].kind == kindForget
		n := 1
		for n < len(recs) && (recs[n].kind == kindForget) == forget {
			n++
		}
		frames = append(frames, framesOf(x.encode(recs[:n]), forget)...)
		recs = recs[n:]
	}
	return frames
}

// frame is an encoded frame on its way to the peers; forget frames go
// only to the peers that read them.
type frame struct {
	b      []byte
	forget bool
}

func framesOf(bs [][]byte, forget bool) []frame {
	out := make([]frame, len(bs))
	for i, b := range bs {
		out[i] = frame{b: b, forget: forget}
	}
	return out
}

// snapshotFrames encodes the in-flight count of every endpoint reported
// nonzero since the last snapshot; those now at zero are sent once more
// and then no longer.
func (x *Exchange) snapshotFrames() [][]byte {
	x.mu.Lock()
	recs := make([]record, 0, len(x.reported))
	for e, pool := range x.reported {
		n := e.OwnInFlight()
		recs = append(recs, record{kind: kindInFlight, pool: pool, addr: e.Address, inFlight: n})
		if n <= 0 {
			delete(x.reported, e)
		}
	}
	x.mu.Unlock()
	return x.encode(recs)
}

// encode packs records into frames of at most MaxFrameBytes.
func (x *Exchange) encode(recs []record) [][]byte {
	var frames [][]byte
	var b []byte
	for i := range recs {
		if !validRecord(&recs[i]) {
			continue
		}
		start := len(b)
		if b == nil {
			b = append(b, frameHeader...)
			start = len(frameHeader)
		}
		b = appendRecord(b, &recs[i])
		if len(b) > x.opts.MaxFrameBytes && start > len(frameHeader) {
			frames = append(frames, b[:start:start])
			b = append(append([]byte{}, frameHeader...), b[start:]...)
		}
	}
	if len(b) > len(frameHeader) {
		frames = append(frames, b)
	}
	x.metrics.sent.Add(float64(len(recs)))
	return frames
}

// fanOut queues the frames to every peer; a peer whose queue is full
// misses them (and they are counted).
func (x *Exchange) fanOut(frames []frame) {
	if len(frames) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.peers {
		for _, f := range frames {
			select {
			case p.frames <- f:
			default:
				x.metrics.dropped.WithLabelValues("peer-queue").Inc()
			}
		}
	}
}

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

// LearnerFuncs are functions as a Learner (a scheduler built after the
// exchange, whose Peers it is); a nil one ignores its records.
type LearnerFuncs struct {
	Learn, Forget func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64)
}

// LearnPeerBlocks implements Learner.
func (f LearnerFuncs) LearnPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if f.Learn != nil {
		f.Learn(pool, e, blocks)
	}
}

// ForgetPeerBlocks implements Learner.
func (f LearnerFuncs) ForgetPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if f.Forget != nil {
		f.Forget(pool, e, blocks)
	}
}
