// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
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
	// (and heals as a gap). Zero: 4 MiB.
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
	// its connection failed. Zero: 1s.
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

	mu      sync.Mutex
	ctx     context.Context
	streams map[string]*stream // by endpoint address (ip:port)
	wg      sync.WaitGroup
}

// stream is one endpoint's subscription state. seq fields are touched only
// by the goroutine that reads the endpoint's messages.
type stream struct {
	address, ns, pool, ip string
	ep                    *Endpoint
	cancel                context.CancelFunc
	limiter               *rate.Limiter
	last                  uint64
	has                   bool
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
	return &Manager{opts: opts, metrics: m, streams: map[string]*stream{}}, nil
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
	sub := zmq4.NewSub(ctx)
	if err := sub.Listen(m.opts.ListenEndpoint); err != nil {
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
		m.receive(ctx, sub, nil)
	}()
	return nil
}

// Wait waits for every goroutine of the manager to end (after Start's
// context ended).
func (m *Manager) Wait() { m.wg.Wait() }

// Add starts indexing the endpoint at address (ip:port) of the pool
// namespace/pool: with
// SocketPort, a subscription dialing its publisher; else the messages the
// listen socket receives for it. Adding an address twice is a no-op.
func (m *Manager) Add(namespace, pool, address string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.streams[address]; ok || m.ctx == nil || m.ctx.Err() != nil {
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
	m.streams[address] = s
	m.metrics.active.Inc()
	m.metrics.unconfirmed.WithLabelValues(namespace, pool).Inc()
	if m.opts.SocketPort == 0 {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	s.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.dial(ctx, s)
	}()
}

// Remove stops indexing the endpoint at address and forgets its blocks.
func (m *Manager) Remove(address string) {
	m.mu.Lock()
	s, ok := m.streams[address]
	delete(m.streams, address)
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

// Endpoint is the event index of the endpoint at address, nil when it is
// not indexed.
func (m *Manager) Endpoint(address string) *Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.streams[address]; ok {
		return s.ep
	}
	return nil
}

func (m *Manager) stream(address string) *stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streams[address]
}

// dial keeps a subscription to s's publisher until ctx ends.
func (m *Manager) dial(ctx context.Context, s *stream) {
	endpoint := "tcp://" + net.JoinHostPort(s.ip, strconv.Itoa(m.opts.SocketPort))
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			m.metrics.reconnects.WithLabelValues(s.address).Inc()
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.opts.RetryInterval):
			}
		}
		sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0))
		if err := sub.Dial(endpoint); err != nil {
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
		m.receive(ctx, sub, s)
		_ = sub.Close()
	}
}

// receive reads messages until the socket fails or ctx ends; s is the
// endpoint of a dialed socket, nil for the listen socket (routed by topic).
func (m *Manager) receive(ctx context.Context, sub zmq4.Socket, s *stream) {
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() == nil {
				m.opts.Logger.V(4).Info("receiving KV events failed", "err", err.Error())
				label := "listen"
				if s != nil {
					label = s.address
				}
				m.metrics.errors.WithLabelValues(label, "recv").Inc()
			}
			return
		}
		mm, err := ParseFrames(msg.Frames)
		if err != nil {
			m.opts.Logger.V(4).Info("malformed KV event message", "err", err.Error())
			continue
		}
		target := s
		endpoint, model, terr := ParseTopic(mm.Topic)
		if target == nil {
			if terr != nil {
				continue
			}
			// Removed endpoints are not indexed: their messages are dropped.
			if target = m.stream(endpoint); target == nil {
				continue
			}
		}
		if m.opts.Model != "" && (terr != nil || model == "") {
			model = m.opts.Model
		}
		m.metrics.messages.WithLabelValues(target.address).Inc()
		m.handle(ctx, target, model, mm)
	}
}

// handle applies one live message of s's stream: a gap since the last is
// replayed first, or, failing that, the event index restarts unconfirmed.
func (m *Manager) handle(ctx context.Context, s *stream, model string, msg Message) {
	before := s.ep.Blocks()
	wasConfirmed := s.ep.Confirmed()
	defer func() {
		m.metrics.blocks.WithLabelValues(s.ns, s.pool).Add(float64(s.ep.Blocks() - before))
		if now := s.ep.Confirmed(); now != wasConfirmed {
			if now {
				m.metrics.unconfirmed.WithLabelValues(s.ns, s.pool).Dec()
			} else {
				m.metrics.unconfirmed.WithLabelValues(s.ns, s.pool).Inc()
			}
		}
	}()
	switch {
	case s.has && msg.Seq == s.last:
		return // a duplicate
	case s.has && msg.Seq < s.last:
		// The server restarted its sequence: it restarted.
		m.opts.Logger.V(2).Info("KV event sequence restarted", "namespace", s.ns, "pool", s.pool, "endpoint", s.address, "last", s.last, "seq", msg.Seq)
		s.has = false
	}
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
func (m *Manager) replay(ctx context.Context, s *stream, model string, from, until uint64) (ok bool) {
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
	dealer := zmq4.NewDealer(ctx, zmq4.WithTimeout(m.opts.ReplayTimeout), zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	endpoint := "tcp://" + net.JoinHostPort(s.ip, strconv.Itoa(m.opts.ReplayPort))
	if err := dealer.Dial(endpoint); err != nil {
		m.metrics.errors.WithLabelValues(s.address, "replay-connect").Inc()
		return false
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		m.metrics.errors.WithLabelValues(s.address, "replay-send").Inc()
		return false
	}
	// Replies are [empty, seq, payload] (vLLM) or [empty, topic, seq,
	// payload] (llm-d's simulator); the last has seq ReplayDone.
	next, whole := from, from == 0
	if from == 0 {
		s.ep.reset(false)
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
		frames := got.msg.Frames
		if len(frames) > 0 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		if len(frames) == 3 {
			frames = frames[1:]
		}
		if len(frames) != 2 || len(frames[0]) != 8 {
			return false
		}
		seq := binary.BigEndian.Uint64(frames[0])
		if seq == ReplayDone {
			if from == 0 && whole {
				s.ep.setConfirmed()
			}
			return next >= until
		}
		if seq < next || seq >= until {
			continue
		}
		if from == 0 && next == 0 {
			whole = seq <= 1
			next = seq
		}
		if seq != next {
			return false
		}
		m.apply(s, model, frames[1])
		next = seq + 1
	}
}
