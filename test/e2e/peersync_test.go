// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package e2e_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/peersync"
)

// With --peer-sync the replicas stream their picks to each other: requests
// sharing a prefix, spread by the gateway over both replicas, land on one
// server, and each replica has applied the blocks of every pick the other
// made (poolpicker_peer_sync_received_records_total{kind="blocks"}), so
// its index knows the prefix from the other's picks too.
func TestPeerSyncAffinity(t *testing.T) {
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for _, r := range stack.Replicas() {
		peers = append(peers, net.JoinHostPort(r.IP, strconv.Itoa(ports[0])))
	}
	// The replicas authenticate each other with a key both read.
	key := filepath.Join(t.TempDir(), "peer-sync-key")
	if err := os.WriteFile(key, []byte("an e2e peer-sync key of more than sixteen bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	withPickerArgs(t, "--peer-sync", fmt.Sprintf("--peer-sync-port=%d", ports[0]), "--peer-sync-peers="+strings.Join(peers, ","), "--peer-sync-key-file="+key)
	replicas := stack.Replicas()
	for _, r := range replicas {
		poll.Until(t, 30*time.Second, r.Pod.String()+" streaming to its peer", func() bool {
			return peerSyncMetric(t, r.MetricsAddr, peersync.MetricStreams, "") == 1
		})
	}
	before := map[string]float64{}
	for _, r := range replicas {
		before[r.IP] = replicaBlocksReceived(t, r.MetricsAddr)
	}

	sp := samplePools[0]
	prefix := strings.Repeat("Peer sync shares what each replica picked with the other replicas. ", 64) // ~4 KiB
	per, picks := map[string]int{}, map[string]int{}
	const n = 20
	for i := range n {
		o := send(context.Background(), sp.host, "/v1/completions", completion(sp.model, prefix+fmt.Sprintf("Question %d?", i), 2, false), nil)
		if !o.ok() {
			t.Fatalf("request %d: %v", i, o)
		}
		per[o.endpoint]++
		host, _, _ := net.SplitHostPort(o.picker)
		picks[host]++
	}
	if len(picks) != len(replicas) {
		t.Fatalf("requests decided by pickers %v; want all %d replicas to have decided some", picks, len(replicas))
	}
	if len(per) != 1 {
		t.Fatalf("shared-prefix requests through pickers %v spread over servers %v; want one server", picks, per)
	}
	for _, r := range replicas {
		others := n - picks[r.IP]
		poll.Until(t, 30*time.Second, fmt.Sprintf("%s applying the blocks of the other replica's %d picks", r.Pod, others), func() bool {
			return replicaBlocksReceived(t, r.MetricsAddr)-before[r.IP] >= float64(others)
		})
	}
	t.Logf("shared-prefix requests per server %v, per picker %v", per, picks)
}

// replicaBlocksReceived is a replica's count of peers' picks applied.
func replicaBlocksReceived(t *testing.T, addr string) float64 {
	t.Helper()
	return peerSyncMetric(t, addr, peersync.MetricReceived, "blocks")
}

// peerSyncMetric sums a replica's series of a peer-sync gauge or counter
// (those of kind, when given); 0 while the replica does not answer.
func peerSyncMetric(t *testing.T, addr, name, kind string) float64 {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0 // restarting
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse picker metrics: %v", err)
	}
	total := 0.0
	for _, m := range fams[name].GetMetric() {
		if kind != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "kind" && l.GetValue() == kind }) {
			continue
		}
		total += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return total
}
