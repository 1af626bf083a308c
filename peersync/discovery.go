// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"net"
	"sync"
	"time"
)

// Discovery: the peer list (the controllers' ready picker pods, or
// --peer-sync-peers resolved every RefreshInterval) and a sending goroutine
// per peer.

// syncPeers starts a sender for each new peer and stops those gone, and
// tells the inbound side the peers' hosts (their IPs, names resolved).
func (x *Exchange) syncPeers(ctx context.Context, wg *sync.WaitGroup) {
	want, hosts := map[string]bool{}, map[string]bool{}
	names := map[string]bool{}
	for _, a := range x.opts.Peers() {
		want[a] = true
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			hosts[ip.String()] = true
			continue
		}
		names[h] = true
		for _, ip := range x.resolve(ctx, h) {
			hosts[ip] = true
		}
	}
	for name := range x.resolved {
		if !names[name] {
			delete(x.resolved, name)
		}
	}
	x.setPeerHosts(hosts)
	x.mu.Lock()
	defer x.mu.Unlock()
	for addr, p := range x.peers {
		if !want[addr] {
			p.cancel()
			delete(x.peers, addr)
		}
	}
	for addr := range want {
		if x.peers[addr] != nil {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peer{addr: addr, frames: make(chan frame, 256), cancel: cancel}
		x.peers[addr] = p
		wg.Add(1)
		go func() { defer wg.Done(); x.send(pctx, p) }()
	}
	x.countPeers()
}

// resolveTimeout bounds a lookup of a peer's name.
const resolveTimeout = 2 * time.Second

// resolve returns the IPs of name, or, when the lookup fails, those it had
// last.
func (x *Exchange) resolve(ctx context.Context, name string) []string {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := x.opts.Resolver.LookupHost(ctx, name)
	if err != nil {
		x.opts.Logger.V(2).Info("peer sync: a peer's name did not resolve; keeping its last addresses", "peer", name, "err", err.Error(), "addresses", x.resolved[name])
		return x.resolved[name]
	}
	ips := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip.String())
		}
	}
	x.resolved[name] = ips
	return ips
}

// countPeers sets the peers gauge: the peers streamed to, not those that
// refused (this replica itself). Called with mu held.
func (x *Exchange) countPeers() {
	n := 0
	for _, p := range x.peers {
		if !p.refused {
			n++
		}
	}
	x.metrics.peers.Set(float64(n))
}
