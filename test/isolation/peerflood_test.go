// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/peersync"
)

// pushMethod is peer sync's one stream.
const pushMethod = "/poolpicker.peersync.v1.PeerSync/Push"

// rawCodec sends the test's bytes as they are: a peer flood speaks no
// protocol it has no key for.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// peerFlood: from the first replica's address (a peer every replica takes
// streams from), without the peer-sync key, 16 connections to every other
// replica's peer-sync port, 64 streams each, every stream sending frames
// that claim to be records.
func peerFlood(t *testing.T) (func(), <-chan struct{}) {
	const conns, streams = 16, 64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var clients []*grpc.ClientConn
	before := peerRefusals(t)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(firstPickerIP)}}
		return d.DialContext(ctx, "tcp", addr)
	}
	frame := bytes.Repeat([]byte{0xff}, 1024)
	for _, r := range stack.Replicas() {
		if r.IP == firstPickerIP {
			continue
		}
		for range conns {
			c, err := grpc.NewClient(net.JoinHostPort(r.IP, strconv.Itoa(peerSyncPort)),
				grpc.WithContextDialer(dial),
				grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})), // a flood verifies nothing
				grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
			for range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := c.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pushMethod)
					if err != nil {
						return // refused at once
					}
					for range 10 {
						if s.SendMsg(&frame) != nil {
							break
						}
					}
					var got []byte
					for s.RecvMsg(&got) == nil {
					}
				}()
			}
		}
	}
	poll.Until(t, 2*time.Minute, "the peer flood refused", func() bool { return peerRefusals(t) > before })
	return func() {
		cancel()
		wg.Wait()
		for _, c := range clients {
			c.Close()
		}
	}, nil
}

// peerRefusals counts the peer-sync streams and connections the replicas
// refused or limited.
func peerRefusals(t *testing.T) float64 {
	t.Helper()
	return metricSum(t, peersync.MetricRefused, nil) + metricSum(t, peersync.MetricLimited, nil)
}
