// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Defaults of Options.
const (
	DefaultTopicFilter          = "kv@"
	DefaultMaxMessageBytes      = 4 << 20
	DefaultEventsPerSecond      = 20000
	DefaultMaxBlocksPerEndpoint = 1 << 20
	DefaultReplayTimeout        = 2 * time.Second
	DefaultRetryInterval        = time.Second
)

// Options configure a Manager. Zero values mean the documented defaults.
type Options struct {
	// Hasher computes the blocks' keys. Required.
	Hasher *Hasher
	// ListenEndpoint, when set, is where a SUB socket binds for servers that
	// dial the picker (llm-d's simulator, vLLM with a connecting
	// publisher), e.g. "tcp://*:5557"; a message is routed to the endpoint
	// its topic names (kv@<ip:port>@<model>). Empty: none.
	ListenEndpoint string
	// SocketPort, when set, is the port of each endpoint's publisher, which
	// the manager dials at the endpoint's IP for as long as the endpoint is
	// served (vLLM's default publisher binds tcp://*:5557). Zero: none.
	SocketPort int
	// ReplayPort is the port of each endpoint's replay (ROUTER) socket,
	// asked for the batches a gap skipped. Zero: no replay; a gap clears
	// the endpoint's event index.
	ReplayPort int
	// TopicFilter is the topic prefix subscribed to. Empty: "kv@".
	TopicFilter string
	// Model is the base model of a server whose topic names none (vLLM's
	// default topic is empty); the keys' root. Empty: the topic's.
	Model string
	// MaxMessageBytes bounds a message's payload; a bigger one is refused
	// (and heals as a gap). A connection announcing a message of more than
	// this and 64 KiB of topic and framing is closed at the frame's header.
	// Zero: 4 MiB.
	MaxMessageBytes int
	// EventsPerSecond bounds, per endpoint, the events applied per second
	// (bursts of as many); beyond it the endpoint's event index is cleared
	// and rebuilt. Zero: 20000.
	EventsPerSecond float64
	// MaxBlocksPerEndpoint bounds the blocks indexed per endpoint; stores
	// beyond it are refused. Zero: 1<<20.
	MaxBlocksPerEndpoint int
	// Budget, when set, is the process-wide bound the blocks are reserved
	// from; a PoolBudget's, from each endpoint's pool's share.
	Budget Budget
	// ReplayTimeout bounds a replay. Zero: 2s.
	ReplayTimeout time.Duration
	// RetryInterval is the wait before a subscription dials again after
	// its connection failed, doubled for each failure in a row up to 32
	// times; and the wait between its catch-ups with the replay socket
	// until its first message, doubled the same way. Zero: 1s.
	RetryInterval time.Duration
	// Limits bound a decoded batch.
	Limits Limits
	// Registerer receives the metrics. Nil: none are served.
	Registerer prometheus.Registerer
	Logger     logr.Logger
}

func (o *Options) setDefaults() {
	if o.TopicFilter == "" {
		o.TopicFilter = DefaultTopicFilter
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.EventsPerSecond <= 0 {
		o.EventsPerSecond = DefaultEventsPerSecond
	}
	if o.MaxBlocksPerEndpoint <= 0 {
		o.MaxBlocksPerEndpoint = DefaultMaxBlocksPerEndpoint
	}
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = DefaultReplayTimeout
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
}

// Manager keeps the event index of every endpoint it was given (Add) and
// the subscriptions that feed them. Its goroutines end with the context
// given to Start, or with an endpoint's Remove; Wait waits for them.
//
// Lock order: Manager.mu, then an Endpoint's mu (never the other way).
type Manager struct {
	opts    Options
	metrics *metrics

	mu  sync.Mutex
	ctx context.Context
	// streams are keyed by pool and address: pools whose selectors share
	// a pod each have their own subscription and event index, charged to
	// their own account, and one pool's leaving ends only its own.
	streams map[streamKey]*stream
	// at are the streams of each address (ip:port), for the messages of
	// the listen socket, whose topic names the address only.
	at map[string][]*stream
	wg sync.WaitGroup
}

// streamKey names one pool's subscription to one endpoint.
type streamKey struct{ namespace, pool, address string }

// stream is one endpoint's subscription state. The goroutine that reads
// the endpoint's messages and the one that catches up with its replay
// socket take mu for the fields below it.
type stream struct {
	address, ns, pool, ip string
	ep                    *Endpoint
	cancel                context.CancelFunc
	limiter               *rate.Limiter

	mu   sync.Mutex
	last uint64
	has  bool
	// seen: a live message of the stream came.
	seen bool
	// caughtUp: the batches up to last came by replay on this connection,
	// so live messages up to last, queued meanwhile, are duplicates; the
	// first live message past last ends it.
	caughtUp bool
	// model is the model of the last message's topic, for replayed
	// batches whose answer names none.
	model string
}

// NewManager checks opts and returns a manager; Start runs it.
func NewManager(opts Options) (*Manager, error) {
	opts.setDefaults()
	if opts.Hasher == nil {
		return nil, errors.New("kv events: no hasher")
	}
	if opts.ListenEndpoint == "" && opts.SocketPort == 0 {
		return nil, errors.New("kv events: neither a listen endpoint nor a socket port to dial")
	}
	if opts.SocketPort < 0 || opts.SocketPort > 65535 || opts.ReplayPort < 0 || opts.ReplayPort > 65535 {
		return nil, fmt.Errorf("kv events: socket port %d or replay port %d out of range", opts.SocketPort, opts.ReplayPort)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Manager{opts: opts, metrics: m, streams: map[streamKey]*stream{}, at: map[string][]*stream{}}, nil
}

// Start binds ListenEndpoint (if set) and serves it until ctx ends; the
// endpoints' subscriptions are children of ctx. It returns once bound.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
	if m.opts.ListenEndpoint == "" {
		return nil
	}
	sub := zmq4.NewSub(m.socketContext(ctx))
	if err := sub.Listen(boundedEndpoint(m.opts.ListenEndpoint)); err != nil {
		_ = sub.Close()
		return fmt.Errorf("kv events: listen on %s: %w", m.opts.ListenEndpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, m.opts.TopicFilter); err != nil {
		_ = sub.Close()
		return fmt.Errorf("kv events: subscribe: %w", err)
	}
	m.opts.Logger.V(2).Info("listening for KV events", "endpoint", sub.Addr().String())
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer sub.Close()
		m.receive(ctx, sub)
	}()
	return nil
}

// Wait waits for every goroutine of the manager to end (after Start's
// context ended).
func (m *Manager) Wait() { m.wg.Wait() }

// Add starts indexing the endpoint at address (ip:port) for the pool
// namespace/pool: with SocketPort, a subscription dialing its publisher;
// else the messages the listen socket receives for it. Each pool that
// adds an address has its own index of it, its blocks reserved from that
// pool's account. Adding an address to a pool twice is a no-op.
func (m *Manager) Add(namespace, pool, address string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := streamKey{namespace, pool, address}
	if _, ok := m.streams[key]; ok || m.ctx == nil || m.ctx.Err() != nil {
		return
	}
	ip, _, err := net.SplitHostPort(address)
	if err != nil {
		ip = address
	}
	s := &stream{address: address, ns: namespace, pool: pool, ip: ip,
		limiter: rate.NewLimiter(rate.Limit(m.opts.EventsPerSecond), int(max(m.opts.EventsPerSecond, 1)))}
	budget := m.opts.Budget
	if pb, ok := budget.(PoolBudget); ok {
		budget = pb.ForPool(namespace, pool)
	}
	s.ep = newEndpoint(m.opts.Hasher, m.opts.MaxBlocksPerEndpoint, budget, func(reason string, n int) {
		m.metrics.dropped.WithLabelValues(namespace, pool, reason).Add(float64(n))
	})
	m.streams[key] = s
	m.at[address] = append(m.at[address], s)
	m.metrics.active.Inc()
	m.metrics.unconfirmed.WithLabelValues(namespace, pool).Inc()
	if m.opts.SocketPort == 0 && m.opts.ReplayPort == 0 {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	s.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		if m.opts.SocketPort == 0 {
			m.settle(ctx, s)
			return
		}
		m.dial(ctx, s)
	}()
}

// settle catches s up with its server's replay socket when s's messages
// come to the listen socket, as follow does for a dialed one.
func (m *Manager) settle(ctx context.Context, s *stream) {
	wait := m.opts.RetryInterval
	for m.catchUp(ctx, s) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxRetryFactor*m.opts.RetryInterval)
	}
}

// Remove stops indexing the endpoint at address for the pool
// namespace/pool and releases its blocks; other pools' indexes of the
// address go on.
func (m *Manager) Remove(namespace, pool, address string) {
	m.mu.Lock()
	key := streamKey{namespace, pool, address}
	s, ok := m.streams[key]
	if ok {
		delete(m.streams, key)
		if rest := slices.DeleteFunc(m.at[address], func(o *stream) bool { return o == s }); len(rest) > 0 {
			m.at[address] = rest
		} else {
			delete(m.at, address)
		}
	}
	m.mu.Unlock()
	if !ok {
		return
	}
	if s.cancel != nil {
		s.cancel()
	}
	m.metrics.active.Dec()
	if !s.ep.Confirmed() {
		m.metrics.unconfirmed.WithLabelValues(s.ns, s.pool).Dec()
	}
	m.metrics.blocks.WithLabelValues(s.ns, s.pool).Sub(float64(s.ep.Blocks()))
	s.ep.reset(false)
}

// Endpoint is the pool namespace/pool's event index of the endpoint at
// address, nil when the pool does not index it.
func (m *Manager) Endpoint(namespace, pool, address string) *Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.streams[streamKey{namespace, pool, address}]; ok {
		return s.ep
	}
	return nil
}

// streamsAt are the streams of the endpoint at address, one per pool
// indexing it.
func (m *Manager) streamsAt(address string) []*stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.at[address])
}

// maxRetryFactor bounds the backoff of a subscription that keeps failing:
// at most this many RetryIntervals between dials.
const maxRetryFactor = 32

// socketContext is ctx for the manager's sockets: their connections refuse
// messages beyond the bound (transport.go).
func (m *Manager) socketContext(ctx context.Context) context.Context {
	return withFrameBound(ctx, int64(m.opts.MaxMessageBytes)+messageOverheadBytes)
}

// dial keeps a subscription to s's publisher until ctx ends. A
// subscription that fails (a refused dial, a connection the publisher
// closed or broke the bounds on) dials again after RetryInterval, doubled
// for every failure in a row up to maxRetryFactor times.
func (m *Manager) dial(ctx context.Context, s *stream) {
	endpoint := "tcp://" + net.JoinHostPort(s.ip, strconv.Itoa(m.opts.SocketPort))
	wait := m.opts.RetryInterval
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			m.metrics.reconnects.WithLabelValues(s.address).Inc()
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, maxRetryFactor*m.opts.RetryInterval)
		}
		sub := zmq4.NewSub(m.socketContext(ctx), zmq4.WithDialerMaxRetries(0))
		if err := sub.Dial(boundedEndpoint(endpoint)); err != nil {
			_ = sub.Close()
			m.metrics.errors.WithLabelValues(s.address, "connect").Inc()
			m.opts.Logger.V(4).Info("dialing KV events failed", "namespace", s.ns, "pool", s.pool, "endpoint", endpoint, "err", err.Error())
			continue
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, m.opts.TopicFilter); err != nil {
			_ = sub.Close()
			m.metrics.errors.WithLabelValues(s.address, "subscribe").Inc()
			continue
		}
		if m.follow(ctx, sub, s) {
			wait = m.opts.RetryInterval
		}
	}
}

// follow applies the messages of s's subscription sub until it fails or
// ctx ends, then closes sub; it reports whether a message came. ZMQ starts
// a subscription only once the publisher has read it (the slow joiner), so
// what the server published before is asked of its replay socket
// (catchUp) as soon as the subscription is sent, and again until the first
// message comes (after RetryInterval, doubled each time up to
// maxRetryFactor times), for batches published while the subscription was
// on its way. From the first message on, a missed batch shows as a gap in
// the sequence numbers.
func (m *Manager) follow(ctx context.Context, sub zmq4.Socket, s *stream) (received bool) {
	msgs := make(chan zmq4.Msg)
	failed := make(chan error, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			msg, err := sub.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case msgs <- msg:
			case <-stop:
				return
			}
		}
	}()
	defer func() {
		close(stop)
		_ = sub.Close()
		wg.Wait()
	}()
	s.mu.Lock()
	s.seen = false
	s.mu.Unlock()
	wait := m.opts.RetryInterval
	settle := time.NewTimer(wait)
	defer settle.Stop()
	if !m.catchUp(ctx, s) {
		settle.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return received
		case <-settle.C:
			if m.catchUp(ctx, s) {
				wait = min(2*wait, maxRetryFactor*m.opts.RetryInterval)
				settle.Reset(wait)
			}
		case err := <-failed:
			if ctx.Err() == nil {
				m.recvFailed(s, err)
			}
			return received
		case msg := <-msgs:
			received = true
			m.received(ctx, msg, s)
		}
	}
}

// recvFailed counts and logs a failed subscription of s (nil: the listen
// socket's).
func (m *Manager) recvFailed(s *stream, err error) {
	label, kv := "listen", []any{}
	if s != nil {
		label, kv = s.address, []any{"namespace", s.ns, "pool", s.pool, "endpoint", s.address}
	}
	var bound *FrameBoundError
	if errors.As(err, &bound) {
		// A publisher breaking the bound is not a blip: said at level 0.
		m.metrics.errors.WithLabelValues(label, "message-bytes").Inc()
		if s != nil {
			m.metrics.dropped.WithLabelValues(s.ns, s.pool, DropSize).Inc()
		}
		m.opts.Logger.Info("KV event connection closed: the publisher broke the message bound; its endpoint is scored from the learned index until it sends within it", append(kv, "err", err.Error())...)
		return
	}
	m.metrics.errors.WithLabelValues(label, "recv").Inc()
	m.opts.Logger.V(4).Info("receiving KV events failed", append(kv, "err", err.Error())...)
}

// receive reads the listen socket's messages, routed by topic, until ctx
// ends. A connection that fails (a server gone, one that broke the bounds)
// is dropped by the socket; the others go on.
func (m *Manager) receive(ctx context.Context, sub zmq4.Socket) {
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
			m.recvFailed(nil, err)
			continue
		}
		m.received(ctx, msg, nil)
	}
}

// received applies one message: of s's stream, or, with s nil, of every
// stream of the endpoint its topic names (one per pool indexing it).
func (m *Manager) received(ctx context.Context, msg zmq4.Msg, s *stream) {
	mm, err := ParseFrames(msg.Frames)
	if err != nil {
		m.opts.Logger.V(4).Info("malformed KV event message", "err", err.Error())
		return
	}
	model := m.modelOf(mm.Topic)
	if s != nil {
		m.deliver(ctx, s, model, mm)
		m.metrics.messages.WithLabelValues(s.address).Inc()
		return
	}
	endpoint, _, err := ParseTopic(mm.Topic)
	if err != nil {
		return
	}
	// Removed endpoints are not indexed: their messages are dropped.
	streams := m.streamsAt(endpoint)
	for _, s := range streams {
		m.deliver(ctx, s, model, mm)
	}
	if len(streams) > 0 {
		m.metrics.messages.WithLabelValues(endpoint).Inc()
	}
}

// deliver applies one live message of model to s.
func (m *Manager) deliver(ctx context.Context, s *stream, model string, msg Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.model, s.seen = model, true
	m.handle(ctx, s, model, msg)
}

// modelOf is the model of a message of topic.
func (m *Manager) modelOf(topic string) string {
	_, model, err := ParseTopic(topic)
	if m.opts.Model != "" && (err != nil || model == "") {
		return m.opts.Model
	}
	return model
}

// track returns what updates s's gauges with the change it brackets.
func (m *Manager) track(s *stream) func() {
	before := s.ep.Blocks()
	wasConfirmed := s.ep.Confirmed()
	return func() {
		m.metrics.blocks.WithLabelValues(s.ns, s.pool).Add(float64(s.ep.Blocks() - before))
		if now := s.ep.Confirmed(); now != wasConfirmed {
			if now {
				m.metrics.unconfirmed.WithLabelValues(s.ns, s.pool).Dec()
			} else {
				m.metrics.unconfirmed.WithLabelValues(s.ns, s.pool).Inc()
			}
		}
	}
}

// handle applies one live message of s's stream: a gap since the last is
// replayed first, or, failing that, the event index restarts unconfirmed.
func (m *Manager) handle(ctx context.Context, s *stream, model string, msg Message) {
	defer m.track(s)()
	switch {
	case s.has && s.caughtUp && msg.Seq <= s.last:
		return // replayed already
	case s.has && msg.Seq == s.last:
		return // a duplicate
	case s.has && msg.Seq < s.last:
		// The server restarted its sequence: it restarted.
		m.opts.Logger.V(2).Info("KV event sequence restarted", "namespace", s.ns, "pool", s.pool, "endpoint", s.address, "last", s.last, "seq", msg.Seq)
		s.has = false
	}
	s.caughtUp = false
	if !s.has {
		s.has = true
		switch {
		case msg.Seq <= 1:
			// The stream from its start (vLLM counts from 0, llm-d's
			// simulator from 1): the index will be the whole truth.
			s.ep.reset(true)
		case m.replay(ctx, s, model, 0, msg.Seq):
		default:
			s.ep.reset(false)
		}
		s.last = msg.Seq - 1
	}
	if msg.Seq > s.last+1 {
		m.metrics.gaps.WithLabelValues(s.ns, s.pool).Inc()
		m.opts.Logger.V(2).Info("gap in KV events", "namespace", s.ns, "pool", s.pool, "endpoint", s.address, "last", s.last, "seq", msg.Seq)
		if !m.replay(ctx, s, model, s.last+1, msg.Seq) {
			m.resync(s)
		}
	}
	m.apply(s, model, msg.Payload)
	s.last = msg.Seq
}

// catchUp asks s's replay socket for what the server published that the
// index has not seen: from the last batch seen, which the server must still
// hold for the two histories to be one, or else from the start (a new
// subscription, a restarted server), rebuilding the index.
// It reports whether it should be asked again: no live message has come
// yet.
func (m *Manager) catchUp(ctx context.Context, s *stream) (again bool) {
	if m.opts.ReplayPort == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen {
		// From the first message on, gaps show in the sequence numbers.
		return false
	}
	defer m.track(s)()
	if s.has {
		continued, broken := false, false
		ok := m.replayed(ctx, s, s.last, func(seq uint64, model string, payload []byte) bool {
			switch {
			case !continued && seq != s.last:
				broken = true
			case !continued:
				continued = true
			case seq != s.last+1:
				broken = true
			default:
				m.apply(s, model, payload)
				s.last = seq
			}
			return !broken
		})
		switch {
		case !ok:
			// No answer: the live messages' sequence numbers tell.
			return true
		case continued && !broken:
			s.caughtUp = true
			return true
		}
		// The server no longer holds the last batch seen, or not what
		// follows it: it restarted, or its history moved on too far.
		m.opts.Logger.V(2).Info("KV event history of a server does not continue the index's; rebuilding it", "namespace", s.ns, "pool", s.pool, "endpoint", s.address, "last", s.last)
	}
	s.ep.reset(false)
	s.has, s.caughtUp = false, false
	started, whole, broken := false, false, false
	var next uint64
	ok := m.replayed(ctx, s, 0, func(seq uint64, model string, payload []byte) bool {
		if !started {
			started, whole, next = true, seq <= 1, seq
		}
		if seq != next {
			broken = true
			return false
		}
		m.apply(s, model, payload)
		next = seq + 1
		return true
	})
	switch {
	case !ok || broken:
		s.ep.reset(false)
	case !started:
		// Nothing published yet: the stream starts with the next message.
		s.ep.setConfirmed()
	default:
		if whole {
			s.ep.setConfirmed()
		}
		s.has, s.caughtUp, s.last = true, true, next-1
	}
	return true
}

// resync clears s's event index: it is not the server's truth any more.
func (m *Manager) resync(s *stream) {
	m.metrics.resyncs.WithLabelValues(s.ns, s.pool).Inc()
	m.opts.Logger.V(2).Info("KV event index of an endpoint cleared; scored from the learned index until rebuilt", "namespace", s.ns, "pool", s.pool, "endpoint", s.address)
	s.ep.reset(false)
}

// apply decodes and applies one payload; one it cannot apply whole loses
// the index its truth (resync).
func (m *Manager) apply(s *stream, model string, payload []byte) {
	if len(payload) > m.opts.MaxMessageBytes {
		m.metrics.dropped.WithLabelValues(s.ns, s.pool, DropSize).Inc()
		m.resync(s)
		return
	}
	b, err := DecodeBatch(payload, m.opts.Limits)
	if err != nil {
		m.metrics.dropped.WithLabelValues(s.ns, s.pool, DropDecode).Inc()
		m.opts.Logger.V(2).Info("undecodable KV event batch", "namespace", s.ns, "pool", s.pool, "endpoint", s.address, "err", err.Error())
		m.resync(s)
		return
	}
	if !s.limiter.AllowN(time.Now(), len(b.Events)) {
		m.metrics.dropped.WithLabelValues(s.ns, s.pool, DropRate).Add(float64(len(b.Events)))
		m.resync(s)
		return
	}
	s.ep.apply(model, &b)
}

// replay asks s's replay socket for the batches from..until-1 and applies
// them; it reports whether they all came, in order. From 0, the first
// batch the server still holds must be its first (seq 0 or 1), or the
// history is not whole and the index stays unconfirmed.
func (m *Manager) replay(ctx context.Context, s *stream, model string, from, until uint64) bool {
	if from == 0 {
		s.ep.reset(false)
	}
	next, started, whole, broken := from, from != 0, false, false
	ok := m.replayed(ctx, s, from, func(seq uint64, _ string, payload []byte) bool {
		if seq >= until {
			return true
		}
		if !started {
			started, whole, next = true, seq <= 1, seq
		}
		if seq != next {
			broken = true
			return false
		}
		m.apply(s, model, payload)
		next = seq + 1
		return true
	})
	if !ok || broken {
		return false
	}
	if from == 0 && whole {
		s.ep.setConfirmed()
	}
	return next >= until
}

// replayed asks s's replay socket for the batches from sequence number from
// on and calls f with each (its model from the answer's topic, else the
// stream's), in the order they come, until f returns false; it reports
// whether the answer came whole (to its end marker, or to where f
// stopped), within ReplayTimeout.
func (m *Manager) replayed(ctx context.Context, s *stream, from uint64, f func(seq uint64, model string, payload []byte) bool) (ok bool) {
	if m.opts.ReplayPort == 0 {
		return false
	}
	defer func() {
		result := "ok"
		if !ok {
			result = "failed"
		}
		m.metrics.replays.WithLabelValues(s.ns, s.pool, result).Inc()
	}()
	ctx, cancel := context.WithTimeout(ctx, m.opts.ReplayTimeout)
	defer cancel()
	dealer := zmq4.NewDealer(m.socketContext(ctx), zmq4.WithTimeout(m.opts.ReplayTimeout), zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	endpoint := "tcp://" + net.JoinHostPort(s.ip, strconv.Itoa(m.opts.ReplayPort))
	if err := dealer.Dial(boundedEndpoint(endpoint)); err != nil {
		m.metrics.errors.WithLabelValues(s.address, "replay-connect").Inc()
		return false
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		m.metrics.errors.WithLabelValues(s.address, "replay-send").Inc()
		return false
	}
	type result struct {
		msg zmq4.Msg
		err error
	}
	for {
		r := make(chan result, 1)
		go func() {
			msg, err := dealer.Recv()
			r <- result{msg, err}
		}()
		var got result
		select {
		case got = <-r:
		case <-ctx.Done():
			_ = dealer.Close()
			<-r
			return false
		}
		if got.err != nil {
			m.metrics.errors.WithLabelValues(s.address, "replay-recv").Inc()
			return false
		}
		// Replies are [empty, seq, payload] (vLLM) or [empty, topic, seq,
		// payload] (llm-d's simulator); the last has seq ReplayDone.
		frames := got.msg.Frames
		if len(frames) > 0 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		model := s.model
		if m.opts.Model != "" {
			model = m.opts.Model
		}
		if len(frames) == 3 {
			if t := string(frames[0]); t != "" {
				model = m.modelOf(t)
			}
			frames = frames[1:]
		}
		if len(frames) != 2 || len(frames[0]) != 8 {
			return false
		}
		seq := binary.BigEndian.Uint64(frames[0])
		if seq == ReplayDone {
			return true
		}
		if seq < from {
			continue
		}
		if !f(seq, model, frames[1]) {
			return true
		}
	}
}
