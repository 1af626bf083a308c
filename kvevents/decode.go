// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type.
type Kind uint8

// The event kinds vLLM publishes.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one decoded KV-cache event.
type Event struct {
	Kind Kind
	// BlockHashes are the server's hashes of the blocks stored or removed.
	// A hash sent as bytes (vLLM's sha256 hashes) is its last 8 bytes,
	// big-endian, as llm-d reads them.
	BlockHashes []uint64
	// ParentHash is the server's hash of the block before the first stored
	// one; HasParent is false when the stored blocks start the sequence
	// (a nil or 0 parent).
	ParentHash uint64
	HasParent  bool
	// Tokens are the stored blocks' token ids, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// LoRAName is the adapter the blocks were computed under ("" for the
	// base model); it replaces the topic's model in the keys' root.
	LoRAName string
	// Medium is the device tier ("GPU", "CPU"...), "" when not sent.
	Medium string
}

// Batch is one message's payload.
type Batch struct {
	Timestamp float64
	Events    []Event
	// DataParallelRank is the publishing rank, -1 when not sent.
	DataParallelRank int
}

// Message is one ZMQ message of the event stream.
type Message struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// ReplayDone is the sequence number of the replay socket's last message.
const ReplayDone = ^uint64(0)

// ParseFrames reads a message's three frames.
func ParseFrames(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("kv events: message of %d frames, want 3 (topic, sequence, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("kv events: sequence frame of %d bytes, want 8", len(frames[1]))
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// ParseTopic splits "kv@<endpoint>@<model>"; the model may itself hold '@'.
func ParseTopic(topic string) (endpoint, model string, err error) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return "", "", fmt.Errorf("kv events: topic %q does not start with \"kv@\"", topic)
	}
	endpoint, model, ok = strings.Cut(rest, "@")
	if !ok || endpoint == "" {
		return "", "", fmt.Errorf("kv events: topic %q is not kv@<endpoint>@<model>", topic)
	}
	return endpoint, model, nil
}

// Limits bound what one payload may hold; DecodeBatch refuses more.
type Limits struct {
	// Events per batch. Zero: 4096.
	Events int
	// BlockHashes per event. Zero: 65536.
	BlockHashes int
	// Tokens per event. Zero: 1<<20.
	Tokens int
}

func (l *Limits) setDefaults() {
	if l.Events <= 0 {
		l.Events = 4096
	}
	if l.BlockHashes <= 0 {
		l.BlockHashes = 1 << 16
	}
	if l.Tokens <= 0 {
		l.Tokens = 1 << 20
	}
}

var errTruncated = errors.New("truncated")

// decoder reads msgpack from a byte slice, checking every length against
// what is left, so a forged length cannot allocate more than the payload.
type decoder struct {
	r *bytes.Reader
	d *msgpack.Decoder
}

func (d *decoder) isNil() bool {
	c, err := d.d.PeekCode()
	return err == nil && c == msgpcode.Nil
}

// DecodeBatch decodes a payload, positional or named-field events alike.
// An event of an unknown tag is skipped (newer servers add kinds); anything
// malformed is an error naming the place.
func DecodeBatch(payload []byte, lim Limits) (Batch, error) {
	lim.setDefaults()
	r := bytes.NewReader(payload)
	d := &decoder{r: r, d: msgpack.NewDecoder(r)}
	b, err := d.batch(lim)
	if err != nil {
		return Batch{}, fmt.Errorf("kv events: %w", err)
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("kv events: %d bytes after the batch", r.Len())
	}
	return b, nil
}

func (d *decoder) batch(lim Limits) (Batch, error) {
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return Batch{}, fmt.Errorf("batch: %w", err)
	}
	if n < 2 || n > 3 {
		return Batch{}, fmt.Errorf("batch of %d fields, want [timestamp, events, rank?]", n)
	}
	b := Batch{DataParallelRank: -1}
	if b.Timestamp, err = d.d.DecodeFloat64(); err != nil {
		return Batch{}, fmt.Errorf("batch timestamp: %w", err)
	}
	m, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return Batch{}, fmt.Errorf("batch events: %w", err)
	}
	if m > lim.Events {
		return Batch{}, fmt.Errorf("batch of %d events, more than the limit %d", m, lim.Events)
	}
	b.Events = make([]Event, 0, max(m, 0))
	for i := range max(m, 0) {
		ev, ok, err := d.event(lim)
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		if ok {
			b.Events = append(b.Events, ev)
		}
	}
	if n == 3 {
		if d.isNil() {
			_ = d.d.DecodeNil()
		} else if b.DataParallelRank, err = d.d.DecodeInt(); err != nil {
			return Batch{}, fmt.Errorf("batch data parallel rank: %w", err)
		}
	}
	return b, nil
}

// length checks a container length (-1 is nil) against the bytes left: every
// element takes at least one.
func (d *decoder) length(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("length %d beyond the %d bytes left: %w", n, d.r.Len(), errTruncated)
	}
	return n, nil
}

// Field orders of the positional events after the tag (vLLM's
// msgspec array_like structs; SGLang's are the same).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	removedFields = []string{"block_hashes", "medium"}
)

func (d *decoder) event(lim Limits) (Event, bool, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return Event{}, false, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return d.namedEvent(lim)
	}
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return Event{}, false, err
	}
	if n < 1 {
		return Event{}, false, errors.New("event without a tag")
	}
	tag, err := d.d.DecodeString()
	if err != nil {
		return Event{}, false, fmt.Errorf("tag: %w", err)
	}
	var ev Event
	var order []string
	switch tag {
	case "BlockStored":
		ev.Kind, order = BlockStored, storedFields
	case "BlockRemoved":
		ev.Kind, order = BlockRemoved, removedFields
	case "AllBlocksCleared":
		ev.Kind = AllBlocksCleared
	}
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(order) {
			name = order[i-1]
		}
		if err := d.field(&ev, name, lim); err != nil {
			return Event{}, false, err
		}
	}
	return ev, ev.Kind != 0, d.check(ev)
}

func (d *decoder) namedEvent(lim Limits) (Event, bool, error) {
	n, err := d.length(d.d.DecodeMapLen())
	if err != nil {
		return Event{}, false, err
	}
	var ev Event
	tagged := false
	for range n {
		key, err := d.d.DecodeString()
		if err != nil {
			return Event{}, false, fmt.Errorf("field name: %w", err)
		}
		if key == "type" {
			tag, err := d.d.DecodeString()
			if err != nil {
				return Event{}, false, fmt.Errorf("type: %w", err)
			}
			tagged = true
			switch tag {
			case "BlockStored":
				ev.Kind = BlockStored
			case "BlockRemoved":
				ev.Kind = BlockRemoved
			case "AllBlocksCleared":
				ev.Kind = AllBlocksCleared
			}
			continue
		}
		if err := d.field(&ev, key, lim); err != nil {
			return Event{}, false, err
		}
	}
	if !tagged {
		return Event{}, false, errors.New(`named-field event without "type"`)
	}
	return ev, ev.Kind != 0, d.check(ev)
}

// check refuses a stored event whose tokens do not fill its blocks.
func (d *decoder) check(ev Event) error {
	if ev.Kind != BlockStored || len(ev.Tokens) == 0 {
		return nil
	}
	if ev.BlockSize <= 0 || len(ev.Tokens) != ev.BlockSize*len(ev.BlockHashes) {
		return fmt.Errorf("BlockStored of %d blocks of %d tokens carries %d tokens", len(ev.BlockHashes), ev.BlockSize, len(ev.Tokens))
	}
	return nil
}

// field decodes the value of the field name into ev; other fields are
// skipped.
func (d *decoder) field(ev *Event, name string, lim Limits) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = d.hashes(lim.BlockHashes)
	case "parent_block_hash":
		if d.isNil() {
			err = d.d.DecodeNil()
			break
		}
		ev.ParentHash, err = d.hash()
		ev.HasParent = ev.ParentHash != 0
	case "token_ids":
		ev.Tokens, err = d.tokens(lim.Tokens)
	case "block_size":
		if d.isNil() {
			err = d.d.DecodeNil()
			break
		}
		ev.BlockSize, err = d.d.DecodeInt()
		if err == nil && (ev.BlockSize < 0 || ev.BlockSize > 1<<16) {
			err = fmt.Errorf("%d out of range", ev.BlockSize)
		}
	case "medium", "lora_name":
		var s string
		if d.isNil() {
			err = d.d.DecodeNil()
		} else if s, err = d.d.DecodeString(); err == nil && len(s) > 1024 {
			err = fmt.Errorf("%d bytes long", len(s))
		}
		if name == "medium" {
			ev.Medium = s
		} else {
			ev.LoRAName = s
		}
	default:
		err = d.d.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cmpOr(name, "extra field"), err)
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (d *decoder) hashes(limit int) ([]uint64, error) {
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("%d hashes, more than the limit %d", n, limit)
	}
	out := make([]uint64, max(n, 0))
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

// hash reads a block hash: an integer (signed ones as their bits) or bytes.
func (d *decoder) hash() (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := d.d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("empty hash")
		}
		var buf [8]byte
		copy(buf[max(0, 8-len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(buf[:]), nil
	}
	if c == msgpcode.Uint64 || c == msgpcode.Uint32 || c == msgpcode.Uint16 || c == msgpcode.Uint8 || msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh {
		return d.d.DecodeUint64()
	}
	v, err := d.d.DecodeInt64()
	return uint64(v), err
}

func (d *decoder) tokens(limit int) ([]uint32, error) {
	if d.isNil() {
		return nil, d.d.DecodeNil()
	}
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("%d tokens, more than the limit %d", n, limit)
	}
	out := make([]uint32, max(n, 0))
	for i := range out {
		if out[i], err = d.d.DecodeUint32(); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}
