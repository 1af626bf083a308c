// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// go-zeromq/zmq4 allocates each frame at the size its header announces (up
// to 2^63 bytes) before reading it, and appends frames to a message without
// limit: a hostile or broken publisher could make the picker allocate
// without bound. The manager's sockets therefore speak TCP through
// boundedScheme, whose connections follow the ZMTP framing as the bytes pass
// and fail a connection at the header of a frame or message beyond its
// bound, before zmq4 sees the size.
const (
	boundedScheme = "poolpicker-bounded-tcp"
	// zmtpGreetingBytes is the fixed-size greeting that opens a ZMTP 3
	// connection, before any frame.
	zmtpGreetingBytes = 64
	// maxFramesPerMessage bounds a message's frames: a KV-event message has
	// three, a replay answer five with its routing frames.
	maxFramesPerMessage = 16
	// messageOverheadBytes is what a message may hold beside its payload
	// (topic, sequence, routing frames); the payload itself is bounded by
	// Options.MaxMessageBytes.
	messageOverheadBytes = 64 << 10
)

func init() {
	if err := zmq4.RegisterTransport(boundedScheme, boundedTransport{}); err != nil {
		panic(err)
	}
}

// boundedEndpoint is endpoint (tcp://host:port) over boundedScheme.
func boundedEndpoint(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		return boundedScheme + "://" + rest
	}
	return endpoint
}

type frameBoundKey struct{}

// withFrameBound makes the sockets created under ctx refuse messages of more
// than maxMessageBytes (the frames' bodies together).
func withFrameBound(ctx context.Context, maxMessageBytes int64) context.Context {
	return context.WithValue(ctx, frameBoundKey{}, maxMessageBytes)
}

// FrameBoundError is the error a connection fails with when its peer
// announces a frame or message beyond the bound; the connection is closed
// and nothing of the frame is allocated.
type FrameBoundError struct {
	// Bytes is what the peer announced (the message so far with this
	// frame), Limit the bound; Frames, when not zero, is a message's frame
	// count beyond maxFramesPerMessage.
	Bytes, Limit int64
	Frames       int
}

func (e *FrameBoundError) Error() string {
	if e.Frames > 0 {
		return fmt.Sprintf("kv events: the publisher sent a message of more than %d frames; connection closed", maxFramesPerMessage)
	}
	return fmt.Sprintf("kv events: the publisher announced a message of %d bytes, beyond the bound of %d; connection closed", e.Bytes, e.Limit)
}

// Timeout makes the error a net.Error that is no timeout, so zmq4 closes
// the connection on it.
func (e *FrameBoundError) Timeout() bool { return false }

// Temporary is false: the publisher broke the bound.
func (e *FrameBoundError) Temporary() bool { return false }

var _ net.Error = (*FrameBoundError)(nil)

type boundedTransport struct{}

func (boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return bound(ctx, c), nil
}

func (boundedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	limit, _ := ctx.Value(frameBoundKey{}).(int64)
	return &boundedListener{Listener: l, limit: limit, conns: map[*boundedConn]struct{}{}}, nil
}

func (boundedTransport) Addr(ep string) (string, error) {
	return transport.New("tcp").Addr(ep)
}

// boundedListener bounds the connections it accepts and closes them when it
// is closed: zmq4 closes a socket's connections before its listener, and one
// accepted in between would otherwise stay open, its reader with it.
type boundedListener struct {
	net.Listener
	limit int64

	mu     sync.Mutex
	conns  map[*boundedConn]struct{}
	closed bool
}

func (l *boundedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	bc := &boundedConn{Conn: c, limit: l.limit}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns[bc] = struct{}{}
	bc.forget = func() {
		l.mu.Lock()
		delete(l.conns, bc)
		l.mu.Unlock()
	}
	return bc, nil
}

func (l *boundedListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return err
}

func bound(ctx context.Context, c net.Conn) net.Conn {
	limit, _ := ctx.Value(frameBoundKey{}).(int64)
	if limit <= 0 {
		return c
	}
	return &boundedConn{Conn: c, limit: limit}
}

// boundedConn checks the ZMTP framing of what it reads: after the greeting,
// frames of a flags byte (bit 0: more frames follow, bit 1: an 8-byte size,
// else a 1-byte size), the size, and the body. zmq4 reads a connection from
// one goroutine, so the state needs no lock.
type boundedConn struct {
	net.Conn
	limit int64

	greeting int64 // greeting bytes still to pass
	started  bool
	// header collects the current frame's header; body is what is left of
	// the current frame's body.
	header  [9]byte
	headerN int
	body    int64
	// message counts the current message's bytes and frames.
	message int64
	frames  int
	err     error
	// forget, when set, tells the listener that accepted the connection
	// that it is closed.
	forget func()
}

func (c *boundedConn) Close() error {
	if c.forget != nil {
		c.forget()
	}
	return c.Conn.Close()
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if c.limit <= 0 {
		return n, err
	}
	if berr := c.scan(p[:n]); berr != nil {
		c.err = berr
		_ = c.Conn.Close()
		return 0, berr
	}
	return n, err
}

// scan follows the framing over b and fails at the first header beyond the
// bound.
func (c *boundedConn) scan(b []byte) error {
	if !c.started {
		c.started, c.greeting = true, zmtpGreetingBytes
	}
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(int64(len(b)), c.greeting)
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := min(int64(len(b)), c.body)
			c.body -= k
			b = b[k:]
		default:
			c.header[c.headerN] = b[0]
			c.headerN++
			b = b[1:]
			want := 2
			if c.header[0]&0x02 != 0 {
				want = 9
			}
			if c.headerN < want {
				continue
			}
			size := int64(c.header[1])
			if want == 9 {
				u := binary.BigEndian.Uint64(c.header[1:9])
				if u > uint64(c.limit) {
					return &FrameBoundError{Bytes: int64(min(u, 1<<62)), Limit: c.limit}
				}
				size = int64(u)
			}
			c.headerN = 0
			c.frames++
			c.message += size
			if c.frames > maxFramesPerMessage {
				return &FrameBoundError{Frames: c.frames, Limit: c.limit}
			}
			if c.message > c.limit {
				return &FrameBoundError{Bytes: c.message, Limit: c.limit}
			}
			if c.header[0]&0x01 == 0 {
				c.frames, c.message = 0, 0
			}
			c.body = size
		}
	}
	return nil
}
