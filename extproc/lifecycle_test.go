// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	if os.Getenv(modelServerEnv) != "" {
		if err := firstPickModelServer(); err != nil {
			os.Stderr.WriteString("model server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func healthClient(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return healthpb.NewHealthClient(c)
}

// awaitHealth reads a health Watch stream until it reports want.
func awaitHealth(t *testing.T, w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("watch ended before %v: %v", want, err)
		}
		if r.GetStatus() == want {
			return
		}
	}
}

func TestHealth(t *testing.T) {
	f := newPools(t, 3, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	hc := healthClient(t, ts.healthAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	live, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthLiveness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, live, healthpb.HealthCheckResponse_SERVING)
	for _, svc := range []string{HealthReadiness, HealthExtProc} {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
		f.pools[1].SetSynced(false)
		awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
		f.pools[1].SetSynced(true)
		awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
	}

	empty := startServer(t, newPools(t, 0, 0).reg, leastInFlight{}, Options{Insecure: true})
	w, err := healthClient(t, empty.healthAddr).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
}

// TestHealthWaitsForPoolController: with PoolsSynced set, readiness follows
// the pool controller's initial sync, and a picker serving no pool can be ready.
func TestHealthWaitsForPoolController(t *testing.T) {
	var controllerSynced atomic.Bool
	ts := startServer(t, newPools(t, 0, 0).reg, leastInFlight{}, Options{Insecure: true, PoolsSynced: controllerSynced.Load})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthClient(t, ts.healthAddr).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	controllerSynced.Store(true)
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
}

func TestGracefulDrain(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, DrainTimeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthClient(t, ts.healthAddr).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	if err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)

	g := ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
	g.recv()

	ts.cancel() // SIGTERM
	awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	// The open stream finishes its response while draining.
	g.send(respHeaders([]hdr{{":status", "200", true}}, false, ""))
	g.recv()
	g.send(respBody([]byte(`{}`), true))
	g.recv()
	g.expectEOF()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Fatal(err)
		}
		ts.done <- nil // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after the last stream ended")
	}
	if f.totalInFlight() != 0 {
		t.Fatal("in-flight left")
	}
}

func TestDrainTimeoutCutsStreams(t *testing.T) {
	f := newPools(t, 1, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, DrainTimeout: 100 * time.Millisecond})
	g := ts.open(t, "", nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
	g.recv()
	ts.cancel()
	if _, err := g.stream.Recv(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Fatalf("cut stream ended with %v", err)
	}
	if err := <-ts.done; err != nil {
		t.Fatal(err)
	}
	ts.done <- nil
	if f.totalInFlight() != 0 {
		t.Fatal("cut stream left its in-flight count")
	}
}

func writeCert(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	c, err := selfSignedCertificate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Write then rename, as a Secret volume update does, so the watcher never
	// reads half a file.
	for name, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: c.Certificate[0]}, keyFile: {Type: "PRIVATE KEY", Bytes: keyDER}} {
		tmp := filepath.Join(dir, name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	leaf, _ := x509.ParseCertificate(c.Certificate[0])
	return leaf
}

func handshake(t *testing.T, addr string, maxVersion uint16) (*tls.ConnectionState, error) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MaxVersion: maxVersion, MinVersion: tls.VersionTLS10})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st := c.ConnectionState()
	return &st, nil
}

func TestTLS(t *testing.T) {
	f := newPools(t, 1, 1)
	t.Run("self-signed", func(t *testing.T) {
		ts := startServer(t, f.reg, leastInFlight{}, Options{})
		st, err := handshake(t, ts.addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.NegotiatedProtocol != "h2" || st.Version < tls.VersionTLS12 {
			t.Fatalf("ALPN %q version %x", st.NegotiatedProtocol, st.Version)
		}
		if _, err := handshake(t, ts.addr, tls.VersionTLS11); err == nil {
			t.Fatal("TLS 1.1 accepted")
		}
		// A plaintext client cannot talk to it.
		c, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := extprocv3.NewExternalProcessorClient(c).Process(ctx)
		if err == nil {
			_, err = s.Recv()
		}
		if err == nil || errors.Is(err, io.EOF) {
			t.Fatal("plaintext stream worked against a TLS port")
		}
	})
	t.Run("cert path with reload", func(t *testing.T) {
		old := certReloadInterval
		certReloadInterval = 50 * time.Millisecond
		defer func() { certReloadInterval = old }()
		dir := t.TempDir()
		first := writeCert(t, dir)
		ts := startServer(t, f.reg, leastInFlight{}, Options{CertPath: dir, EnableCertReload: true})
		st, err := handshake(t, ts.addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !st.PeerCertificates[0].Equal(first) {
			t.Fatal("not serving the certificate from cert path")
		}
		second := writeCert(t, dir)
		eventually(t, "the rotated certificate served", func() bool {
			st, err := handshake(t, ts.addr, 0)
			return err == nil && st.PeerCertificates[0].Equal(second)
		})
		// And the rotated server still speaks ext_proc.
		g := ts.open(t, "", nil)
		g.send(reqHeaders(envoyHeaders("GET", "/v1/models"), true))
		r := g.recv()
		checkPool(t, f, destination(t, r, r.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
	})
	t.Run("cert path without reload", func(t *testing.T) {
		dir := t.TempDir()
		first := writeCert(t, dir)
		ts := startServer(t, f.reg, leastInFlight{}, Options{CertPath: dir})
		st, err := handshake(t, ts.addr, 0)
		if err != nil || !st.PeerCertificates[0].Equal(first) {
			t.Fatalf("handshake %v", err)
		}
	})
	t.Run("missing cert path fails start", func(t *testing.T) {
		srv, err := New(f.reg, leastInFlight{}, Options{CertPath: t.TempDir(), GRPCPort: -1, HealthPort: -1})
		if err != nil {
			t.Fatal(err)
		}
		lis, hlis := mustListen(t), mustListen(t)
		srv.opts.GRPCListener, srv.opts.HealthListener = lis, hlis
		if err := srv.Start(context.Background()); err == nil {
			t.Fatal("started without a certificate")
		}
	})
}

// TestUnknownPoolBeforeSyncIsUnavailable: before the pool controller's
// first sync a stream for a pool the picker does not know yet ends with
// gRPC Unavailable (gateways retry another replica), not a 503 for the
// client; once synced, the same stream is answered 503 PoolNotResolved,
// whose message names the opt-in label a pool needs to be served.
func TestUnknownPoolBeforeSyncIsUnavailable(t *testing.T) {
	var controllerSynced atomic.Bool
	ts := startServer(t, newPools(t, 0, 0).reg, leastInFlight{}, Options{Insecure: true, PoolsSynced: controllerSynced.Load})

	g := ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
	if m, err := g.stream.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "not synced yet") {
		t.Fatalf("before sync: got %v, %v; want Unavailable naming the sync", m, err)
	}

	controllerSynced.Store(true)
	g = ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
	if code, msg := immediateCode(t, g.recv()); code != http.StatusServiceUnavailable || !strings.Contains(msg, "PoolNotResolved") ||
		!strings.Contains(msg, "poolpicker.io/picker") {
		t.Fatalf("after sync: %d %s, want 503 PoolNotResolved naming the opt-in label poolpicker.io/picker", code, msg)
	}
}
