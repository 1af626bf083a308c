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
	const key = "--peer-sync-key-file=/etc/poolpicker/peer-sync/key"
	tests := []struct {
		name     string
		args     []string
		wantErr  string
		peerPort int32
	}{
		{name: "off by default"},
		{name: "on: peers discovered at the port", args: []string{"--peer-sync", key}, peerPort: 9004},
		{name: "static peers", args: []string{"--peer-sync", key, "--peer-sync-peers=10.0.0.1:9004,10.0.0.2:9004"}},
		{name: "static peers by name", args: []string{"--peer-sync", key, "--peer-sync-peers=poolpicker-0.poolpicker:9004,poolpicker-1.poolpicker:9004"}},
		{name: "on without a key", args: []string{"--peer-sync"}, wantErr: "--peer-sync needs --peer-sync-key-file: the replicas authenticate each other with its key (the chart mounts one from a Secret it creates)", peerPort: 9004},
		{name: "port taken by ext_proc", args: []string{"--peer-sync", key, "--peer-sync-port=9002"}, wantErr: "--peer-sync-port 9002 and --grpc-port 9002 must differ", peerPort: 9002},
		{name: "port out of range", args: []string{"--peer-sync", key, "--peer-sync-port=70000"}, wantErr: "--peer-sync-port 70000: must be 1..65535", peerPort: 70000},
		{name: "peer without port", args: []string{"--peer-sync", key, "--peer-sync-peers=10.0.0.1"}, wantErr: `--peer-sync-peers: "10.0.0.1" is no host:port`},
		{name: "peer without host", args: []string{"--peer-sync", key, "--peer-sync-peers=:9004"}, wantErr: `--peer-sync-peers: ":9004" is no host:port`},
		{name: "no stream per peer", args: []string{"--peer-sync", key, "--peer-sync-max-streams-per-peer=0"}, wantErr: "--peer-sync-max-streams-per-peer 0: must be at least 1", peerPort: 9004},
		{name: "no connection per peer", args: []string{"--peer-sync", key, "--peer-sync-max-connections-per-peer=0"}, wantErr: "--peer-sync-max-connections-per-peer 0: must be at least 1", peerPort: 9004},
		{name: "no record per second", args: []string{"--peer-sync", key, "--peer-sync-max-records-per-second=0"}, wantErr: "--peer-sync-max-records-per-second 0: must be at least 1", peerPort: 9004},
		{name: "in-flight bound beyond the wire's", args: []string{"--peer-sync", key, "--peer-sync-max-in-flight=70000"}, wantErr: "--peer-sync-max-in-flight 70000: must be 1..65536", peerPort: 9004},
		{name: "timeout shorter than two heartbeats", args: []string{"--peer-sync", key, "--peer-sync-peer-timeout=1s"}, wantErr: "--peer-sync-peer-timeout 1s: must be at least 2s (the peers send every 1s)", peerPort: 9004},
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

// TestPeerSyncKey: replicas of one key file agree on the secret and the
// hash key, another file differs, and an unreadable, empty or short file
// is an error.
func TestPeerSyncKey(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"key": "a secret of sixteen bytes or more\n", "same": "a secret of sixteen bytes or more\n", "other": "another secret of sixteen bytes", "empty": " \n", "short": "s3cret"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := func(file string) ([]byte, uint64, error) {
		var o options
		if err := newFlagSet(io.Discard, &o).Parse([]string{"--peer-sync-key-file=" + filepath.Join(dir, file)}); err != nil {
			t.Fatal(err)
		}
		return peerSyncKey(&o)
	}
	sa, ha, err := key("key")
	if err != nil {
		t.Fatal(err)
	}
	sb, hb, _ := key("same")
	sc, hc, _ := key("other")
	if string(sa) != "a secret of sixteen bytes or more" || string(sa) != string(sb) || ha != hb || string(sa) == string(sc) || ha == hc || ha == 0 {
		t.Fatalf("secrets %q %q %q, hash keys %x %x %x: want the first two equal, the third different", sa, sb, sc, ha, hb, hc)
	}
	for _, file := range []string{"empty", "short"} {
		if _, _, err := key(file); err == nil || !strings.Contains(err.Error(), "at least 16 are needed") {
			t.Fatalf("%s key file: %v", file, err)
		}
	}
	if _, _, err := key("missing"); err == nil {
		t.Fatal("missing key file: no error")
	}
}
