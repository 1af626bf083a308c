// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
)

// sourcePod is a pod a source publishes: its endpoint source and when it
// was created, which decides who holds an address two pods claim.
type sourcePod struct {
	datastore.EndpointSource
	created time.Time
}

// addressBook knows which served pool's pods hold each pod IP, as the pools
// last published them, so that a pool never routes to an address that a
// pod of another namespace now holds: a pool whose watch fails keeps its
// last pods for a while, and a deleted pod's IP may meanwhile be given to
// another tenant's pod. Of two pods of different namespaces claiming one
// IP on a common target port, the one created later holds it (a pod's IP
// never changes, so the older one must be gone); the older is left out of
// its pool until it claims the IP alone.
//
// Its lock comes below servedPool.mu and is never held while taking one.
type addressBook struct {
	mu sync.Mutex
	// byIP: the claims on each IP, by pool.
	byIP map[string]map[*servedPool]ipClaim
}

type ipClaim struct {
	uid     types.UID
	created time.Time
	ports   []int32
}

// newer reports whether c holds the IP over a claim of other.
func (c ipClaim) newer(other ipClaim) bool {
	if !c.created.Equal(other.created) {
		return c.created.After(other.created)
	}
	return c.uid > other.uid
}

func sharePort(a, b []int32) bool {
	for _, p := range a {
		if slices.Contains(b, p) {
			return true
		}
	}
	return false
}

// claim replaces sp's claims with pods on ports (the pool's target ports)
// and returns the pods sp may publish, and the other pools whose published
// pods the change may alter (their holders changed).
func (b *addressBook) claim(sp *servedPool, pods []sourcePod, ports []int32, previous []string) (keep []sourcePod, affected []*servedPool, ips []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byIP == nil {
		b.byIP = map[string]map[*servedPool]ipClaim{}
	}
	touched := map[*servedPool]struct{}{}
	for _, ip := range previous {
		claims := b.byIP[ip]
		delete(claims, sp)
		for other := range claims {
			touched[other] = struct{}{}
		}
		if len(claims) == 0 {
			delete(b.byIP, ip)
		}
	}
	ips = make([]string, 0, len(pods))
	for _, p := range pods {
		claims := b.byIP[p.IP]
		if claims == nil {
			claims = map[*servedPool]ipClaim{}
			b.byIP[p.IP] = claims
		}
		claims[sp] = ipClaim{uid: p.UID, created: p.created, ports: ports}
		ips = append(ips, p.IP)
		for other := range claims {
			if other != sp {
				touched[other] = struct{}{}
			}
		}
	}
	keep = pods
	if b.supersededLocked(sp, pods) > 0 {
		keep = make([]sourcePod, 0, len(pods))
		for _, p := range pods {
			if !b.heldElsewhereLocked(sp, p.IP) {
				keep = append(keep, p)
			}
		}
	}
	for other := range touched {
		if other.key.Namespace != sp.key.Namespace {
			affected = append(affected, other)
		}
	}
	return keep, affected, ips
}

// filter returns the pods of sp that no pod of another namespace holds the
// address of, for a pool whose claims are unchanged.
func (b *addressBook) filter(sp *servedPool, pods []sourcePod) []sourcePod {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.supersededLocked(sp, pods) == 0 {
		return pods
	}
	keep := make([]sourcePod, 0, len(pods))
	for _, p := range pods {
		if !b.heldElsewhereLocked(sp, p.IP) {
			keep = append(keep, p)
		}
	}
	return keep
}

func (b *addressBook) supersededLocked(sp *servedPool, pods []sourcePod) int {
	n := 0
	for _, p := range pods {
		if b.heldElsewhereLocked(sp, p.IP) {
			n++
		}
	}
	return n
}

// heldElsewhereLocked reports whether a pod of another namespace holds ip
// over sp's claim on a port they share.
func (b *addressBook) heldElsewhereLocked(sp *servedPool, ip string) bool {
	claims := b.byIP[ip]
	mine, ok := claims[sp]
	if !ok {
		return false
	}
	for other, c := range claims {
		if other.key.Namespace != sp.key.Namespace && sharePort(mine.ports, c.ports) && c.newer(mine) {
			return true
		}
	}
	return false
}

// forget drops sp's claims; it returns the pools whose holders changed.
func (b *addressBook) forget(sp *servedPool, previous []string) []*servedPool {
	_, affected, _ := b.claim(sp, nil, nil, previous)
	return affected
}
