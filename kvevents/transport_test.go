// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/kvevents"
)

// nullSecurity is ZMTP's NULL mechanism, which zmq4 does not export.
type nullSecurity struct{}

func (nullSecurity) Type() zmq4.SecurityType { return zmq4.NullSecurity }

func (nullSecurity) Handshake(conn *zmq4.Conn, _ bool) error {
	raw, err := conn.Meta.MarshalZMTP()
	if err != nil {
		return err
	}
	if err := conn.SendCmd(zmq4.CmdReady, raw); err != nil {
		return err
	}
	cmd, err := conn.RecvCmd()
	if err != nil {
		return err
	}
	return conn.Peer.Meta.UnmarshalZMTP(cmd.Body)
}

func (nullSecurity) Encrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }
func (nullSecurity) Decrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }

// hostile speaks ZMTP as a PUB socket on c, then announces a frame of 2^40
// bytes, which a subscriber without a bound would allocate at once, and
// keeps the connection open until the peer closes it.
func hostile(t *testing.T, c net.Conn, server bool) {
	defer c.Close()
	if _, err := zmq4.Open(c, nullSecurity{}, zmq4.Pub, zmq4.SocketIdentity("hostile"), server, nil); err != nil {
		return
	}
	header := [9]byte{0x02} // a long frame, the last of its message
	binary.BigEndian.PutUint64(header[1:], 1<<40)
	if _, err := c.Write(header[:]); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

func TestMessageBound(t *testing.T) {
	for _, listen := range []bool{false, true} {
		t.Run(fmt.Sprintf("the server dials the picker %v", listen), func(t *testing.T) {
			h, _ := kvevents.NewHasher(4, "", "")
			opts := kvevents.Options{Hasher: h, MaxMessageBytes: 1 << 20, RetryInterval: 20 * time.Millisecond}
			ev := modelsim.KVEventsOptions{ReplayEndpoint: "replay"}
			if listen {
				ip := podIP()
				opts.ListenEndpoint = fmt.Sprintf("tcp://%s:%d", ip, freePort(t, ip))
				ev.Endpoint, ev.Dial = opts.ListenEndpoint, true
			}
			good := sim(t, ev, modelsim.Options{})
			if !listen {
				opts.SocketPort = port(t, good.KVEventsAddr())
			}
			opts.ReplayPort = port(t, good.KVReplayAddr())
			m, reg := manager(t, opts)

			// The hostile publisher: on its own pod, at the port the
			// manager dials, or dialing the manager's listen socket.
			badIP := podIP()
			var accepted atomic.Int32
			done := make(chan struct{})
			if listen {
				c, err := net.Dial("tcp", opts.ListenEndpoint[len("tcp://"):])
				if err != nil {
					t.Fatal(err)
				}
				go func() { defer close(done); hostile(t, c, false) }()
			} else {
				ln, err := net.Listen("tcp", net.JoinHostPort(badIP, fmt.Sprint(opts.SocketPort)))
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					defer close(done)
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						accepted.Add(1)
						hostile(t, c, true)
					}
				}()
				t.Cleanup(func() { ln.Close(); <-done })
				m.Add("ns", "bad", net.JoinHostPort(badIP, "8000"))
			}
			m.Add("ns", "pool", good.Addr()) // the pool held reads

			label := "listen"
			if !listen {
				label = net.JoinHostPort(badIP, "8000")
			}
			poll.Until(t, 10*time.Second, "the oversized message refused", func() bool {
				return promtest.Value(reg, kvevents.MetricLLMDErrors, map[string]string{"pod_identifier": label, "operation": "message-bytes"}) >= 1
			})
			if listen {
				<-done // the picker closed the hostile connection
			} else {
				// Dropped, then dialed again after the backoff.
				poll.Until(t, 10*time.Second, "the hostile publisher dialed again", func() bool { return accepted.Load() >= 2 })
				if v := promtest.Value(reg, kvevents.MetricDropped, map[string]string{"namespace": "ns", "pool": "bad", "reason": kvevents.DropSize}); v < 1 {
					t.Errorf("%s{reason=%s} = %v, want at least 1", kvevents.MetricDropped, kvevents.DropSize, v)
				}
			}
			// The other endpoint is unaffected.
			p := prompt("after", 5)
			complete(t, good, p)
			held(t, m, good, keys(t, good, h, p), 5)
		})
	}
}
