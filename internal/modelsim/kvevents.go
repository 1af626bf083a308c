// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// KVEventsOptions make a server publish its KV-cache events as vLLM does
// (and llm-d's simulator with --zmq-endpoint): a ZMQ PUB socket sending
// [topic, sequence, msgpack batch], a batch per admission, and a ROUTER
// socket replaying retained batches from a sequence number. Its prompt
// blocks are then keyed by token ids (the tokens /tokenize returns) hashed
// as llm-d hashes them (cbor-fnv with HashSeed), which the events carry.
type KVEventsOptions struct {
	// Endpoint is where the PUB socket binds (vLLM's default,
	// "tcp://127.0.0.1:0" picks a port) or, with Dial, what it dials
	// (llm-d's simulator). Required.
	Endpoint string
	Dial     bool
	// ReplayEndpoint is where the ROUTER socket binds. Empty: no replay.
	ReplayEndpoint string
	// Topic of the messages. Empty: kv@<listen address>@<model>.
	Topic string
	// HashSeed is llm-d's hash seed (vLLM's PYTHONHASHSEED).
	HashSeed string
	// NamedFields sends events as maps with named fields instead of
	// positional arrays.
	NamedFields bool
	// ReplayBatches bounds the batches retained for replay. Zero: 1024.
	ReplayBatches int
	// DropLive, when set, is asked for each batch's sequence number; a batch
	// it returns true for is kept for replay but not published live, as a
	// subscriber sees a message lost on the way.
	DropLive func(seq uint64) bool
}

// kvEvent is one event a server publishes.
type kvEvent struct {
	stored   bool
	hashes   []blockHash
	parent   blockHash // 0: none
	tokens   []uint32
	loraName string
}

// kvPublisher sends a server's events from a goroutine of its own, so the
// engine never waits on a socket under its lock.
type kvPublisher struct {
	opts      KVEventsOptions
	blockSize int
	pub       zmq4.Socket
	router    zmq4.Socket

	mu      sync.Mutex
	pending []kvEvent
	seq     uint64
	kept    []keptBatch // for replay, oldest first
	wake    chan struct{}
	done    chan struct{}
}

type keptBatch struct {
	seq     uint64
	payload []byte
}

func startKVPublisher(ctx context.Context, opts KVEventsOptions, blockSize int, topic string) (*kvPublisher, error) {
	if opts.ReplayBatches <= 0 {
		opts.ReplayBatches = 1024
	}
	if opts.Topic == "" {
		opts.Topic = topic
	}
	p := &kvPublisher{opts: opts, blockSize: blockSize, wake: make(chan struct{}, 1), done: make(chan struct{})}
	var wg sync.WaitGroup
	if opts.Dial {
		// Dialing retries until the subscriber listens, as llm-d's
		// simulator does: in the background.
		p.pub = zmq4.NewPub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true), zmq4.WithDialerRetry(50*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = p.pub.Dial(opts.Endpoint)
		}()
	} else {
		p.pub = zmq4.NewPub(ctx)
		if err := p.pub.Listen(opts.Endpoint); err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("modelsim: KV events on %s: %w", opts.Endpoint, err)
		}
	}
	if opts.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen(opts.ReplayEndpoint); err != nil {
			_ = p.pub.Close()
			_ = p.router.Close()
			return nil, fmt.Errorf("modelsim: KV events replay on %s: %w", opts.ReplayEndpoint, err)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.send(ctx)
	}()
	if p.router != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.serveReplay(ctx)
		}()
	}
	go func() {
		<-ctx.Done()
		_ = p.pub.Close()
		if p.router != nil {
			_ = p.router.Close()
		}
		wg.Wait()
		close(p.done)
	}()
	return p, nil
}

// addr is the address the PUB socket listens on ("" when it dials).
func (p *kvPublisher) addr() string {
	if p.opts.Dial {
		return ""
	}
	return p.pub.Addr().String()
}

func (p *kvPublisher) replayAddr() string {
	if p.router == nil {
		return ""
	}
	return p.router.Addr().String()
}

// publish queues events for the next batch.
func (p *kvPublisher) publish(evs []kvEvent) {
	if len(evs) == 0 {
		return
	}
	p.mu.Lock()
	p.pending = append(p.pending, evs...)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *kvPublisher) send(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		evs := p.pending
		p.pending = nil
		p.seq++
		seq := p.seq
		payload, err := p.encode(evs)
		if err == nil {
			p.kept = append(p.kept, keptBatch{seq, payload})
			if len(p.kept) > p.opts.ReplayBatches {
				p.kept = p.kept[len(p.kept)-p.opts.ReplayBatches:]
			}
		}
		p.mu.Unlock()
		if err != nil || (p.opts.DropLive != nil && p.opts.DropLive(seq)) {
			continue
		}
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		_ = p.pub.Send(zmq4.NewMsgFrom([]byte(p.opts.Topic), s[:], payload))
	}
}

// encode writes a batch [ts, [events...], 0], each event positional or
// named as the options say.
func (p *kvPublisher) encode(evs []kvEvent) ([]byte, error) {
	events := make([]any, len(evs))
	for i, ev := range evs {
		hashes := make([]uint64, len(ev.hashes))
		for j, h := range ev.hashes {
			hashes[j] = uint64(h)
		}
		var parent any
		if ev.parent != 0 {
			parent = uint64(ev.parent)
		}
		var lora any
		if ev.loraName != "" {
			lora = ev.loraName
		}
		switch {
		case ev.stored && p.opts.NamedFields:
			events[i] = map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
				"token_ids": ev.tokens, "block_size": p.blockSize, "lora_id": nil, "medium": "GPU", "lora_name": lora}
		case ev.stored:
			events[i] = []any{"BlockStored", hashes, parent, ev.tokens, p.blockSize, nil, "GPU", lora}
		case p.opts.NamedFields:
			events[i] = map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
		default:
			events[i] = []any{"BlockRemoved", hashes, "GPU"}
		}
	}
	var b bytes.Buffer
	enc := msgpack.NewEncoder(&b)
	enc.UseCompactInts(true)
	err := enc.Encode([]any{float64(time.Now().UnixNano()) / 1e9, events, 0})
	return b.Bytes(), err
}

// serveReplay answers [identity, "", start sequence] with every retained
// batch from it, as [identity, "", topic, sequence, payload], then the end
// marker with sequence 2^64-1.
func (p *kvPublisher) serveReplay(ctx context.Context) {
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var batches []keptBatch
		for _, k := range p.kept {
			if k.seq >= from {
				batches = append(batches, k)
			}
		}
		p.mu.Unlock()
		for _, k := range batches {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], k.seq)
			if p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte(p.opts.Topic), s[:], k.payload)) != nil {
				break
			}
		}
		end := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte{}, end[:], []byte{}))
	}
}

// promptTokenIDs is the simulator's tokenizer: each PromptBytesPerToken
// bytes of the prompt (the last maybe fewer) are one token, its id a hash of
// them below 2^31.
func promptTokenIDs(prompt []byte, bytesPerToken int) []uint32 {
	ids := make([]uint32, 0, (len(prompt)+bytesPerToken-1)/bytesPerToken)
	for i := 0; i < len(prompt); i += bytesPerToken {
		ids = append(ids, uint32(xxhash.Sum64(prompt[i:min(i+bytesPerToken, len(prompt))])>>33))
	}
	return ids
}
