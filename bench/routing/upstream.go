// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// upstreamPrefixType is the reference EPP's approximate prefix cache as a
// scorer, for the sweep's upstream-weights router. It is written from what
// the reference's code does (the llm-d inference scheduler's approximate
// prefix data producer and prefix-cache-scorer), where poolpicker's own
// prefix-cache-scorer differs:
//   - blocks are the server's KV block size in tokens (its scraped
//     block_size, else 16) times 4 characters, at most 256 of them;
//   - an endpoint's LRU holds as many hashes as the server has KV blocks
//     (else 31,250), sized once, when the endpoint is first recorded;
//   - a pick adds the prompt's hashes to the primary endpoint's LRU first to
//     last, so the prompt's first block is its least recent and the first
//     to go: an index that evicts loses a prefix from its start;
//   - the match counts leading blocks until one no endpoint holds, and the
//     score is the matched over the prompt's blocks (no load term, no
//     correction from the servers' reported cached tokens).
const upstreamPrefixType = "upstream-prefix-cache-scorer"

// Defaults of the reference's approximate prefix cache.
const (
	upstreamBlockTokens   = 16
	upstreamCharsPerToken = 4
	upstreamMaxBlocks     = 256
	upstreamLRUCapacity   = 31250
)

// upstreamRegistry is the built-in plugins and the reference's prefix scorer.
func upstreamRegistry() *framework.Registry {
	r := scheduling.NewRegistry()
	if err := r.Register(upstreamPrefixType, newUpstreamPrefix); err != nil {
		panic(err)
	}
	return r
}

type upstreamPrefix struct {
	name framework.TypedName
	key  framework.StateKey

	mu      sync.Mutex
	holders map[uint64]map[framework.EndpointKey]struct{}
	lrus    map[framework.EndpointKey]*simplelru.LRU[uint64, struct{}]
}

func newUpstreamPrefix(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &upstreamPrefix{name: framework.TypedName{Type: upstreamPrefixType, Name: name}, key: framework.StateKey(upstreamPrefixType + "/" + name),
		holders: map[uint64]map[framework.EndpointKey]struct{}{}, lrus: map[framework.EndpointKey]*simplelru.LRU[uint64, struct{}]{}}, nil
}

func (p *upstreamPrefix) TypedName() framework.TypedName { return p.name }

// PromptBytes implements framework.PromptReader: at most 256 blocks of the
// largest block size a server reports here (16 tokens).
func (p *upstreamPrefix) PromptBytes() int {
	return upstreamMaxBlocks * upstreamBlockTokens * upstreamCharsPerToken
}

func (p *upstreamPrefix) Score(_ context.Context, cs *framework.CycleState, req *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	blockTokens := upstreamBlockTokens
	if len(c) > 0 && !c[0].Metrics.IsZero() && c[0].Metrics.BlockSize() > 0 {
		blockTokens = c[0].Metrics.BlockSize()
	}
	size := blockTokens * upstreamCharsPerToken
	prompt := req.Prompt
	if len(prompt) > upstreamMaxBlocks*size {
		prompt = prompt[:upstreamMaxBlocks*size]
	}
	var hashes []uint64
	prev := xxhash.Sum64String(cs.TargetModel)
	var buf [8]byte
	for i := 0; i+size <= len(prompt); i += size {
		d := xxhash.New()
		_, _ = d.Write(prompt[i : i+size])
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		prev = d.Sum64()
		hashes = append(hashes, prev)
	}
	cs.Write(p.key, hashes)
	if len(hashes) == 0 {
		return nil
	}
	matched := map[framework.EndpointKey]int{}
	p.mu.Lock()
	for _, h := range hashes {
		hs := p.holders[h]
		if len(hs) == 0 {
			break
		}
		for k := range hs {
			matched[k]++
		}
	}
	p.mu.Unlock()
	for i := range c {
		scores[i] = float64(matched[c[i].Endpoint.Key()]) / float64(len(hashes))
	}
	return nil
}

// PostPick adds the prompt's blocks to the primary endpoint's LRU, first to
// last.
func (p *upstreamPrefix) PostPick(_ context.Context, cs *framework.CycleState, _ *framework.Request, res *framework.Result) {
	v, _ := cs.Read(p.key)
	hashes, _ := v.([]uint64)
	if len(hashes) == 0 || len(res.Endpoints) == 0 {
		return
	}
	e := res.Endpoints[0]
	key := e.Key()
	p.mu.Lock()
	defer p.mu.Unlock()
	lru := p.lrus[key]
	if lru == nil {
		size := upstreamLRUCapacity
		if m := e.Metrics(); !m.IsZero() && m.NumBlocks() > 0 {
			size = m.NumBlocks()
		}
		lru, _ = simplelru.NewLRU(size, func(h uint64, _ struct{}) {
			delete(p.holders[h], key)
			if len(p.holders[h]) == 0 {
				delete(p.holders, h)
			}
		})
		p.lrus[key] = lru
	}
	for _, h := range hashes {
		lru.Add(h, struct{}{})
	}
	for _, h := range hashes {
		hs := p.holders[h]
		if hs == nil {
			hs = map[framework.EndpointKey]struct{}{}
			p.holders[h] = hs
		}
		hs[key] = struct{}{}
	}
}
