// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
)

// echoEnv names the environment variable that makes the harness's binary
// the floors under a pick after a pause: a loopback echo server, a round
// trip between two processes that wakes both and does nothing else, and an
// ext_proc server that answers every request at once, over the same TLS
// and gRPC as the picker's, with none of its work.
const echoEnv = "SCALE_LOOPBACK_ECHO"

// echoDestination is what the ext_proc server that answers at once routes
// every request to.
const echoDestination = "127.0.0.1:8000"

// serveEcho listens on two loopback ports, prints them, and serves both
// until the parent kills the process: the first writes back every byte a
// connection sends, the second answers ext_proc streams at once.
func serveEcho() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tlsCfg, err := extproc.Options{}.CertificateTLSConfig()
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	extprocv3.RegisterExternalProcessorServer(srv, answerAtOnce{})
	fmt.Printf("LISTEN %s %s\n", l.Addr(), gl.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(gl) }()
	for {
		conn, err := l.Accept()
		if err != nil {
			srv.Stop()
			return errors.Join(err, <-served)
		}
		go func() {
			defer conn.Close()
			_, _ = io.Copy(conn, conn)
		}()
	}
}

// answerAtOnce is an ext_proc server that routes every request to
// echoDestination as soon as its body has arrived, as the picker answers a
// full-duplex stream, and echoes the body.
type answerAtOnce struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (answerAtOnce) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		body := m.GetRequestBody()
		if body == nil || !body.GetEndOfStream() {
			continue
		}
		route := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header: &corev3.HeaderValue{Key: eppclient.HeaderDestination, RawValue: []byte(echoDestination)}}}}}}}}
		echo := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body.GetBody(), EndOfStream: true}}}}}}}
		if err := s.Send(route); err != nil {
			return err
		}
		if err := s.Send(echo); err != nil {
			return err
		}
	}
}

// echoProbe is a connection to a running echo server process, and a
// gateway to its ext_proc server.
type echoProbe struct {
	cmd  *exec.Cmd
	conn net.Conn
	buf  [1]byte
	gw   *gateway
}

// startEcho starts an echo server process at the harness's own priority,
// as the picker runs, and connects to it.
func startEcho(ctx context.Context) (*echoProbe, error) {
	cmd, out, err := startRole(ctx, echoEnv+"=1")
	if err != nil {
		return nil, fmt.Errorf("loopback echo: %w", err)
	}
	e := &echoProbe{cmd: cmd}
	line, err := out.ReadString('\n')
	addrs, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	tcpAddr, grpcAddr, two := strings.Cut(addrs, " ")
	if err != nil || !ok || !two {
		e.close()
		return nil, errors.Join(fmt.Errorf("loopback echo printed %q, want its two addresses", line), err)
	}
	var d net.Dialer
	if e.conn, err = d.DialContext(ctx, "tcp", tcpAddr); err != nil {
		e.close()
		return nil, fmt.Errorf("loopback echo: %w", err)
	}
	if e.gw, err = newGateway(grpcAddr); err != nil {
		e.close()
		return nil, err
	}
	// The connection and its TLS handshake before the first measured
	// request, as the picker's were made by the phases before.
	if _, err := e.answeredAtOnce(ctx); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// roundTrip sends one byte and waits for it to come back.
func (e *echoProbe) roundTrip() (time.Duration, error) {
	t0 := time.Now()
	if _, err := e.conn.Write(e.buf[:]); err != nil {
		return 0, fmt.Errorf("loopback echo: %w", err)
	}
	if _, err := io.ReadFull(e.conn, e.buf[:]); err != nil {
		return 0, fmt.Errorf("loopback echo: %w", err)
	}
	return time.Since(t0), nil
}

// answeredAtOnce sends the harness's request to the ext_proc server that
// answers at once and returns how long the answer took, as a pick's.
func (e *echoProbe) answeredAtOnce(ctx context.Context) (time.Duration, error) {
	res, err := e.gw.client.Do(ctx, e.gw.req)
	if err != nil {
		return 0, fmt.Errorf("ext_proc server that answers at once: %w", err)
	}
	if res.Destination != echoDestination {
		return 0, fmt.Errorf("ext_proc server that answers at once routed to %q, want %s", res.Destination, echoDestination)
	}
	return res.Decided, nil
}

// close ends the connections and the process.
func (e *echoProbe) close() {
	if e.gw != nil {
		e.gw.close()
	}
	if e.conn != nil {
		e.conn.Close()
	}
	_ = e.cmd.Process.Kill()
	_ = e.cmd.Wait() // killed: its exit status says only that
}
