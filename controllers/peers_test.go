// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"slices"
	"testing"
)

// With PeerPort, Parts.Peers lists this deployment's ready pods at that
// port, and follows one turning unready; pods of another deployment are
// not peers. Without it there is no such watch.
func TestPeerReplicas(t *testing.T) {
	pickerNS := env.Namespace(t, "peers")
	name := uniquePickerName("peers")
	self := map[string]string{PickerLabel: name}
	createPod(t, pickerNS, "picker-1", self, podState{ip: "10.40.0.1", ready: true})
	p2 := createPod(t, pickerNS, "picker-2", self, podState{ip: "10.40.0.2", ready: true})
	createPod(t, pickerNS, "stranger", map[string]string{PickerLabel: "other"}, podState{ip: "10.40.0.9", ready: true})

	if r := start(t, nil, Options{Namespaces: []string{pickerNS}, PickerName: name, PickerNamespace: pickerNS}); r.parts.Peers != nil {
		t.Fatal("Parts.Peers without PeerPort")
	}
	r := start(t, nil, Options{Namespaces: []string{pickerNS}, PickerName: name, PickerNamespace: pickerNS, PeerPort: 9004})
	peers := func() []string {
		a := r.parts.Peers.Addresses()
		slices.Sort(a)
		return a
	}
	r.waitFor(t, "both replicas as peers", func() bool {
		return slices.Equal(peers(), []string{"10.40.0.1:9004", "10.40.0.2:9004"})
	})
	setPodStatus(t, p2, "10.40.0.2", false)
	r.waitFor(t, "the unready replica gone from the peers", func() bool {
		return slices.Equal(peers(), []string{"10.40.0.1:9004"})
	})
}
