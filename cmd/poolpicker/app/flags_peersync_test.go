// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package app

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPeerSyncFlags checks the peer-sync flags as run's validation sees
// them: the errors, and the discovery asked of the controllers.
func TestPeerSyncFlags(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantErr  string
		peerPort int32
	}{
		{name: "off by default"},
		{name: "on: peers discovered at the port", args: []string{"--peer-sync"}, peerPort: 9004},
		{name: "static peers", args: []string{"--peer-sync", "--peer-sync-peers=10.0.0.1:9004,10.0.0.2:9004"}},
		{name: "port taken by ext_proc", args: []string{"--peer-sync", "--peer-sync-port=9002"}, wantErr: "--peer-sync-port 9002 and --grpc-port 9002 must differ", peerPort: 9002},
		{name: "port out of range", args: []string{"--peer-sync", "--peer-sync-port=70000"}, wantErr: "--peer-sync-port 70000: must be 1..65535", peerPort: 70000},
		{name: "peer without port", args: []string{"--peer-sync", "--peer-sync-peers=10.0.0.1"}, wantErr: `--peer-sync-peers: "10.0.0.1" is no host:port`},
		{name: "off: the other flags are not checked", args: []string{"--peer-sync-port=9002"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o options
			if err := newFlagSet(io.Discard, &o).Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			derive(&o, deriveInputs{})
			err := validatePeerSync(&o)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if o.controllers.PeerPort != tc.peerPort {
				t.Fatalf("controllers' PeerPort %d, want %d", o.controllers.PeerPort, tc.peerPort)
			}
		})
	}
}

// TestPeerSyncKey: replicas of one deployment agree on the key, another
// deployment or key file differs, and an unreadable or empty file is an
// error.
func TestPeerSyncKey(t *testing.T) {
	dir := t.TempDir()
	secret, empty := filepath.Join(dir, "key"), filepath.Join(dir, "empty")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := func(args ...string) (uint64, error) {
		var o options
		if err := newFlagSet(io.Discard, &o).Parse(args); err != nil {
			t.Fatal(err)
		}
		return peerSyncKey(&o)
	}
	a, _ := key("--picker-namespace=ns", "--picker-name=p")
	b, _ := key("--picker-namespace=ns", "--picker-name=p")
	c, _ := key("--picker-namespace=ns", "--picker-name=q")
	d, _ := key("--picker-namespace=ns", "--picker-name=p", "--peer-sync-key-file="+secret)
	if a != b || a == c || a == d || a == 0 {
		t.Fatalf("keys %x %x %x %x: want the first two equal, the others different", a, b, c, d)
	}
	if _, err := key("--peer-sync-key-file=" + empty); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty key file: %v", err)
	}
	if _, err := key("--peer-sync-key-file=" + filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing key file: no error")
	}
}
