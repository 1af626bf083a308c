// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package prefix holds the built-in prefix-cache scorer and its index of
// the prompt blocks each endpoint is believed to hold in its KV cache.
package prefix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/internal/fairshare"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Type is the prefix-cache scorer's type name.
const Type = "prefix-cache-scorer"

// Defaults of the prefix-cache scorer's parameters (the reference EPP's).
const (
	DefaultHashBlockSize          = 64
	DefaultMaxPrefixBlocksToMatch = 256
	DefaultLRUCapacityPerServer   = 31250
	DefaultBytesPerToken          = 4
	// DefaultMaxIndexBytes is a quarter of the chart's 1 GiB memory
	// limit, as the held request bodies' budget is.
	DefaultMaxIndexBytes = 256 << 20
	// DefaultMaxLRUCapacityPerServer bounds an endpoint's LRU whatever
	// cache size its server reports: eight times the default capacity.
	DefaultMaxLRUCapacityPerServer = 8 * DefaultLRUCapacityPerServer
	// indexBytesPerBlock is what the index costs per block it remembers
	// (the LRU's entry and hash position, the pool's inverted-index entry),
	// rounded up: the memory budget is counted in blocks of this size.
	indexBytesPerBlock = 128
)

// Bounds of the prefix-cache scorer's parameters: beyond them a value is a
// typo, and an LRU that large would exhaust memory.
const (
	maxHashBlockSize        = 1 << 20
	maxPrefixBlocksToMatch  = 1 << 16
	maxLRUCapacityPerServer = 1 << 24
	maxQueueCostTokens      = 1 << 20
)

// Params are the prefix-cache scorer's parameters, as a config gives them.
type Params struct {
	// HashBlockSize is the bytes of prompt per hashed block. Zero: 64.
	HashBlockSize int `json:"hashBlockSize"`
	// MaxPrefixBlocksToMatch bounds the blocks hashed per prompt. Zero: 256.
	MaxPrefixBlocksToMatch int `json:"maxPrefixBlocksToMatch"`
	// LRUCapacityPerServer is the blocks remembered per endpoint when its
	// cache size is unknown (or autoTune is off). Zero: 31250.
	LRUCapacityPerServer int `json:"lruCapacityPerServer"`
	// AutoTune sizes each endpoint's LRU from its scraped cache_config_info
	// (blocks × tokens per block × BytesPerToken / HashBlockSize), at most
	// MaxLRUCapacityPerServer. Absent: true.
	AutoTune *bool `json:"autoTune"`
	// MaxLRUCapacityPerServer bounds the blocks remembered per endpoint
	// whatever cache size its server reports. Zero: 250,000. It is a
	// parameter, not a flag: it bounds one endpoint within its pool's
	// share of this instance's index, beside the LRU's other parameters;
	// what bounds the process is MaxIndexBytes's budget
	// (--prefix-index-max-bytes), which an endpoint's LRU never exceeds.
	MaxLRUCapacityPerServer int `json:"maxLRUCapacityPerServer"`
	// MaxIndexBytes is the memory the scorer's index may take over every
	// pool, counted as 128 bytes a block, shared fairly between namespaces
	// and their pools (internal/fairshare, with 10 % kept for pools that
	// hold none yet): a pool past its share keeps the blocks it was
	// granted and forgets its least recent ones. Zero: the process's
	// budget (poolpicker's --prefix-index-max-bytes, 256 MiB), shared with
	// every other prefix scorer and KV-event index; set: a budget of this
	// instance's own. Negative: no budget.
	MaxIndexBytes int64 `json:"maxIndexBytes"`
	// BytesPerToken is the prompt bytes per token assumed by AutoTune and
	// QueueCostTokens. Zero: 4.
	BytesPerToken int `json:"bytesPerToken"`
	// TokenScaledCapacity makes AutoTune size each endpoint's LRU in the
	// servers' tokens rather than the estimate's: the cache's tokens over
	// the pool's recent scale of the servers' tokens to the estimate (the
	// usage's prompt_tokens against BytesPerToken), so that prompts of
	// longer or shorter words than BytesPerToken take as much of the LRU
	// as of the server's cache. Absent: true.
	TokenScaledCapacity *bool `json:"tokenScaledCapacity"`
	// QueueCostTokens is how many prompt tokens of prefill cost as much
	// time as one more request in flight on an idle pool's endpoint. When
	// set, an endpoint's cached prefix counts for what it saves beyond its
	// extra load: (matched tokens - QueueCostTokens / (1 + least/running) ×
	// (its load - least)) / prompt tokens, where load is the requests in
	// flight (poolpicker's own count, or running plus waiting when the
	// scrape says more), least the least load among the candidates and
	// running the most sequences any candidate was scraped running. Zero:
	// the plain share of the prompt matched, as the reference EPP scores.
	QueueCostTokens int `json:"queueCostTokens"`
	// QueueCostTokensWithRoom replaces QueueCostTokens while the pool's
	// caches have room: while the blocks the index believes some
	// candidate holds, each counted once, fill at most half of the
	// candidates' LRUs together. A prefix copied to a less loaded
	// endpoint then evicts nothing another request still needs and costs
	// only its prefill; under pressure the copy also evicts a prefix that
	// is computed again later, so a holder's queue must be longer before
	// the copy pays. Higher: a busy holder gives way sooner. Zero (the
	// plugin default): QueueCostTokens whatever the caches hold.
	QueueCostTokensWithRoom int `json:"queueCostTokensWithRoom"`
	// UsageFeedback lets the servers' reports of cached prompt tokens (the
	// response usage's prompt_tokens_details.cached_tokens) correct the
	// index: when an endpoint had fewer than predicted (in the server's
	// tokens, which the usage's prompt_tokens scales the estimate to), the
	// blocks it was believed to hold from before the ones it lost are
	// forgotten, by the peer replicas too. Absent: true.
	UsageFeedback *bool `json:"usageFeedback"`
	// QueueMissCost adds to QueueCostTokens what the requests queued ahead
	// cost in prefill when the pool misses: the pool's recent share of
	// prompt tokens its servers reported not cached (usage feedback),
	// times the prompt's tokens, per batch slot. A request waiting behind
	// requests that each prefill most of their prompt waits longer than
	// behind cache hits, so under thrashing a holder's queue counts for
	// more against its cached prefix. False (the plugin default): the
	// queue costs QueueCostTokens per request however the pool hits.
	QueueMissCost bool `json:"queueMissCost"`
	// QueueCostFromServers replaces the tokens a request of a holder's
	// extra load costs (QueueCostTokensWithRoom, else QueueCostTokens) by
	// what the pool's servers show it costs: a least-squares fit, over the
	// last few hundred streamed responses, of each one's time to first
	// token against its uncached prompt tokens (the usage report) and the
	// requests ahead of it on its endpoint at the pick. The seconds a
	// request ahead adds over the seconds a token of prefill takes is the
	// cost in tokens. While the caches have no room it is scaled by
	// QueueCostTokens over QueueCostTokensWithRoom, when both are set; until
	// the fit holds (32 responses, with spread in both), the configured
	// costs apply. Needs QueueCostTokens. False (the plugin default): the
	// configured costs.
	QueueCostFromServers bool `json:"queueCostFromServers"`
	// QueueCostBeyondBatch has QueueCostFromServers fit a second cost: of
	// each request ahead beyond the most sequences a server was seen
	// running (counted per its share of the mean cache, as
	// LoadPerCacheSize counts load), which waits for a sequence to free
	// rather than sharing the batch. On llm-d's simulator a hit's time to
	// first token grew about 28 ms with each request ahead below a full
	// batch and about 0.3 s with each beyond; one slope over both charged
	// about 85 tokens a request, and a holder of two hot prefixes kept
	// them through 11 requests in flight. A holder's queued requests then
	// cost the second figure each, on top of the first. Needs
	// QueueCostFromServers. False (the plugin default): one cost for
	// every request ahead.
	QueueCostBeyondBatch bool `json:"queueCostBeyondBatch"`
	// RendezvousBlocks, when set, makes the choice for a prompt that no
	// candidate is worth sending to for its cache (none is believed to
	// hold its prefix, or every holder is too loaded) the same on every
	// picker replica: the prompt's first RendezvousBlocks blocks, hashed
	// with a fixed function, rank the candidates by rendezvous (highest
	// random weight) hashing of their addresses, and the first of them
	// within RendezvousLoadSlack requests of the least loaded scores
	// RendezvousScore. Replicas that each see a share of the streams then
	// send a new prefix, and spill a hot one, where the others do, so the
	// pool's servers hold each prefix once rather than once per replica.
	// Zero (the plugin default): off, the other scorers decide.
	RendezvousBlocks int `json:"rendezvousBlocks"`
	// RendezvousLoadSlack is how many more requests in flight than the
	// least loaded candidate the rendezvous choice may carry. Zero: 1.
	RendezvousLoadSlack int `json:"rendezvousLoadSlack"`
	// RendezvousSlackPerReplica multiplies RendezvousLoadSlack by the
	// number of picker replicas the scorer estimates share the pool's
	// streams: the servers' scraped running and waiting requests over this
	// replica's own requests in flight, a moving average, rounded, from 1
	// to 8. Replicas bound the choice by views of the load that differ
	// (each counts only its own requests between scrapes, and scrapes at
	// its own instants), so they agree only when the slack is wide against
	// those differences; one replica has nothing to agree with, and a
	// narrow slack spreads its load better. False (the plugin default):
	// RendezvousLoadSlack however many replicas there are.
	RendezvousSlackPerReplica bool `json:"rendezvousSlackPerReplica"`
	// RendezvousNeedsRoom keeps the rendezvous choice for a prompt the
	// index holds nowhere off a candidate whose server has no free
	// sequence (its load, per its share of the pool's mean cache as
	// LoadPerCacheSize counts it, at least the most sequences a server of
	// the pool was seen running) while another within the load slack has
	// one: a new or evicted prefix's prefill then starts at once instead of
	// waiting behind the batch, and the choice falls to the next of the
	// hash's ranking, the same on every replica that sees the same load.
	// A prompt whose holders are all too loaded to be worth their cache
	// spills as without it: sent to whichever server had a free sequence,
	// it would be copied to each in turn. False (the plugin default): the
	// slack alone bounds the choice's load.
	RendezvousNeedsRoom bool `json:"rendezvousNeedsRoom"`
	// RendezvousBalanceCache keeps the rendezvous choice off a candidate
	// whose index holds more than one prompt's blocks beyond the one
	// holding the fewest (of the candidates within the load slack). With
	// few prefixes per endpoint the hash alone spreads them unevenly (12
	// over 4 endpoints: 5 or more on one in 6 pools of 10), and the
	// endpoint given the most serves the most and evicts what its cache
	// cannot hold; with the bound, no endpoint holds more than two prompts
	// beyond another when the prefixes are placed. Replicas agree on it as
	// far as their indexes agree: with peer sync they record the same
	// picks; without it each holds its own share, and they may choose
	// differently. False (the plugin default): the hash within the load
	// slack alone.
	RendezvousBalanceCache bool `json:"rendezvousBalanceCache"`
	// RendezvousBalanceEven tightens RendezvousBalanceCache's bound to
	// less than one prompt's blocks beyond the candidate holding the
	// fewest, each candidate's blocks counted per its share of the
	// candidates' mean cache (as LoadPerCacheSize counts load): a new
	// prefix goes to a server among those holding the fewest prompts for
	// their cache. The looser bound can place two of four chat system
	// prompts on one server and none on another. Measured on llm-d's
	// simulator against the default profile, it shortened the tail with
	// 6, 12 and 24 prefixes and lost hit rate with chat and over
	// capacity, so it is not in the default profile. False (the plugin
	// default): the bound of
	// RendezvousBalanceCache.
	RendezvousBalanceEven bool `json:"rendezvousBalanceEven"`
	// RendezvousBalanceNewPrefix tightens RendezvousBalanceCache's bound
	// for a prompt the index holds on no candidate while a candidate
	// within the load slack holds less than half the prompt's blocks: the
	// prompt then goes to a candidate holding at most half its blocks
	// beyond that one, an empty server before one that holds a prompt.
	// The looser bound lets a second system prompt of the same length join
	// the first on one server while another holds nothing, and their
	// conversations then outgrow that server's cache. Once every server
	// holds a prompt's worth, the looser bound applies again: measured,
	// the tight bound for every new prefix lengthened the tail where the
	// prefixes do not fit the caches. False (the plugin default): the
	// bound of RendezvousBalanceCache.
	RendezvousBalanceNewPrefix bool `json:"rendezvousBalanceNewPrefix"`
	// RendezvousByCacheSize weighs each candidate's rendezvous hash by
	// the size of its server's KV cache (the scraped cache_config_info's
	// blocks × block size), as weighted rendezvous hashing does: a
	// server with twice the cache of another is chosen for twice as
	// many new prefixes. On unequal servers the hash alone gives a
	// server of a quarter of the pool's cache and batch slots as many
	// prefixes as one of twice its share, whose queue and cache then
	// overflow; on equal servers the choice is the hash's. Candidates
	// whose cache size is not known weigh as the mean of those known.
	// Absent: true.
	RendezvousByCacheSize *bool `json:"rendezvousByCacheSize"`
	// LoadPerCacheSize counts, in QueueCostTokens' rule, each candidate's
	// load per token of its server's KV cache, in units of the pool's
	// mean cache (over the servers that say; a server that has not said
	// counts as one of the mean), in the scores as in the fit of
	// QueueCostFromServers, whose unit it is: a request queued on a
	// server of half the mean cache
	// (and, as servers are sized, half the batch) waits as long as two
	// on a mean one, so a small holder's affinity gives way twice as
	// soon. Equal caches count requests as before. Absent: true.
	LoadPerCacheSize *bool `json:"loadPerCacheSize"`
	// ServerCounterAging ages each endpoint's LRU by what its server says
	// it cached: on each new scrape, the growth of its prefix-cache
	// counters (vLLM's vllm:prefix_cache_queries_total less
	// vllm:prefix_cache_hits_total: the prompt tokens it computed), in
	// blocks of HashBlockSize / BytesPerToken tokens, less the blocks this
	// index added since, takes room in the LRU as the newest blocks and
	// pushes out the oldest. With several picker replicas, each records
	// only its own requests; the others' fill the server's cache too, and
	// this is how a replica learns that they evicted what it recorded.
	// Servers that do not export the counters are not aged. False (the
	// plugin default): measured, it made each replica's predictions more
	// often right but not its hit rate better beyond the noise between
	// runs.
	ServerCounterAging bool `json:"serverCounterAging"`
}

// RendezvousScore is what the rendezvous choice scores (RendezvousBlocks):
// in the default profile (weight 3) more than the load scorers' weights
// together, which only break ties, and less than LoRA affinity.
const RendezvousScore = 0.25

// Scorer scores an endpoint by the share of the prompt's leading
// blocks it is believed to hold in its KV cache: longest cached prefix /
// prompt blocks, less its extra load when QueueCostTokens is set. The
// prompt (Request.Prompt) is cut into HashBlockSize-byte blocks, each
// hashed and mixed into the previous block's hash (the first into the
// target model's), so a block hash stands for the whole prefix up to it,
// and equal text under different models never matches. After each
// pick the primary endpoint records the blocks (PostPick). The beliefs are
// an approximation: the server's real cache is not observed.
//
// Saturation (CycleState.Saturated) does not matter here: KV-cache use is
// highest on the servers that hold the most prefixes, and a queue a few
// requests long is cheaper than prefilling a long prompt again. With
// QueueCostTokens the holder's affinity instead wanes with its load against
// the cost of the miss elsewhere: a prefix spills from a holder only when
// the wait there would cost more than the prefill, and the endpoint it
// spills to learns it, so a hot prefix spreads over as many holders as its
// load needs.
type Scorer struct {
	name   framework.TypedName
	key    framework.StateKey
	params Params
	// seed keys the block hashes. The index lives in this process only, so
	// any seed will do; a random one means a client cannot craft prompts
	// whose blocks collide.
	seed maphash.Seed
	// indexes maps a framework.Pool to its *prefixIndex; a removed pool's
	// entry is deleted (PoolRemoved), and one re-added starts empty.
	indexes sync.Map
	// agreement counts the index's predictions against the servers'
	// reports (Result.ObserveCachedTokens).
	agreement agreement
	// peers, when set (peer sync), hears of every pick's blocks, and the
	// blocks are hashed under its key instead of seed, so that the peers'
	// blocks name the same prefixes as this index's.
	peers framework.Peers
	// memory is the index's memory budget in blocks, shared by the pools.
	memory *fairshare.Limit
	// heldBlocks, when set, tells the blocks e's server holds, in this
	// index's blocks, from what every replica knows alike (the precise
	// scorer's KV events) for RendezvousBalanceCache; false: this index's
	// own count. Replicas balancing by their own picks would each keep a
	// new prefix off a different server and place it differently.
	heldBlocks func(pool framework.Pool, e framework.Endpoint) (int, bool)
}

// agreement is the scorer's series of the prediction metrics.
type agreement struct {
	observed, overPredicted, predictedTokens, confirmedTokens prometheus.Counter
}

// Names of the prediction metrics, labelled by plugin instance.
const (
	MetricPredictions     = "poolpicker_prefix_cache_predictions_total"
	MetricOverPredictions = "poolpicker_prefix_cache_overpredictions_total"
	MetricPredictedTokens = "poolpicker_prefix_cache_predicted_tokens_total"
	MetricConfirmedTokens = "poolpicker_prefix_cache_confirmed_tokens_total"
)

// newAgreement registers the prediction metrics with r, or joins those an
// instance of the scorer registered there before, and returns name's series.
func newAgreement(r prometheus.Registerer, name string) (agreement, error) {
	var a agreement
	for _, m := range []struct {
		c          *prometheus.Counter
		name, help string
	}{
		{&a.observed, MetricPredictions, "Reports of cached prompt tokens from the primary endpoint of a pick the prefix index predicted (usage prompt_tokens_details.cached_tokens)."},
		{&a.overPredicted, MetricOverPredictions, "Reports of fewer cached prompt tokens than the prefix index predicted, beyond a block's rounding."},
		{&a.predictedTokens, MetricPredictedTokens, "Prompt tokens the prefix index predicted cached on the primary endpoint, over the reports."},
		{&a.confirmedTokens, MetricConfirmedTokens, "Of the predicted prompt tokens, those the servers reported cached."},
	} {
		vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: m.name, Help: m.help}, []string{"plugin"})
		if err := r.Register(vec); err != nil {
			var dup prometheus.AlreadyRegisteredError
			existing, ok := vec, false
			if errors.As(err, &dup) {
				existing, ok = dup.ExistingCollector.(*prometheus.CounterVec)
			}
			if !ok {
				return agreement{}, fmt.Errorf("registering %s: %w", m.name, err)
			}
			vec = existing
		}
		*m.c = vec.WithLabelValues(name)
	}
	return a, nil
}

var (
	_ framework.Scorer                  = (*Scorer)(nil)
	_ framework.PostPicker              = (*Scorer)(nil)
	_ framework.PromptReader            = (*Scorer)(nil)
	_ framework.CachePredictionObserver = (*Scorer)(nil)
	_ framework.PoolObserver            = (*Scorer)(nil)
	_ framework.PeerLearner             = (*Scorer)(nil)
	_ framework.PeerForgetter           = (*Scorer)(nil)
)

// New is the factory of prefix-cache-scorer; its parameters are
// Params' fields, each with its documented default.
func New(name string, raw json.RawMessage, h framework.Handle) (framework.Plugin, error) {
	raw, err := translateUpstream(raw)
	if err != nil {
		return nil, err
	}
	var p Params
	if err := framework.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	checks := []struct {
		field    string
		v        *int
		def, max int
	}{
		{"hashBlockSize", &p.HashBlockSize, DefaultHashBlockSize, maxHashBlockSize},
		{"maxPrefixBlocksToMatch", &p.MaxPrefixBlocksToMatch, DefaultMaxPrefixBlocksToMatch, maxPrefixBlocksToMatch},
		{"lruCapacityPerServer", &p.LRUCapacityPerServer, DefaultLRUCapacityPerServer, maxLRUCapacityPerServer},
		{"maxLRUCapacityPerServer", &p.MaxLRUCapacityPerServer, DefaultMaxLRUCapacityPerServer, maxLRUCapacityPerServer},
		{"bytesPerToken", &p.BytesPerToken, DefaultBytesPerToken, 64},
		{"queueCostTokens", &p.QueueCostTokens, 0, maxQueueCostTokens},
		{"queueCostTokensWithRoom", &p.QueueCostTokensWithRoom, 0, maxQueueCostTokens},
		{"rendezvousBlocks", &p.RendezvousBlocks, 0, maxPrefixBlocksToMatch},
		{"rendezvousLoadSlack", &p.RendezvousLoadSlack, 1, 1 << 16},
	}
	for _, c := range checks {
		switch {
		case *c.v == 0:
			*c.v = c.def
		case *c.v < 0 || *c.v > c.max:
			return nil, fmt.Errorf("parameters: %s %d must be between 1 and %d", c.field, *c.v, c.max)
		}
	}
	if p.QueueCostFromServers && p.QueueCostTokens == 0 {
		return nil, fmt.Errorf("parameters: queueCostFromServers learns what queueCostTokens sets, and needs it set")
	}
	if p.QueueCostBeyondBatch && !p.QueueCostFromServers {
		return nil, fmt.Errorf("parameters: queueCostBeyondBatch is a second cost of queueCostFromServers' fit, and needs it true")
	}
	if p.RendezvousBalanceNewPrefix && !p.RendezvousBalanceCache {
		return nil, fmt.Errorf("parameters: rendezvousBalanceNewPrefix tightens rendezvousBalanceCache's bound, and needs it true")
	}
	for _, b := range []**bool{&p.AutoTune, &p.UsageFeedback, &p.TokenScaledCapacity, &p.RendezvousByCacheSize, &p.LoadPerCacheSize} {
		if *b == nil {
			t := true
			*b = &t
		}
	}
	a, err := newAgreement(h.MetricsRegisterer(), name)
	if err != nil {
		return nil, err
	}
	// The process's budget (--prefix-index-max-bytes), shared with every
	// other instance; a budget of the instance's own where the parameter
	// sets one or the process has none (a scheduler built without the
	// command).
	var memory *fairshare.Limit
	if m := memoryOf(h.Context()); m != nil && p.MaxIndexBytes == 0 {
		memory = m.Limit
	} else {
		if p.MaxIndexBytes == 0 {
			p.MaxIndexBytes = DefaultMaxIndexBytes
		}
		memory = fairshare.New(fairshare.Options{Name: MemoryLimitName + ":" + name, Flag: "plugin parameter maxIndexBytes",
			Unit: "blocks", Capacity: p.MaxIndexBytes / indexBytesPerBlock})
		if err := h.MetricsRegisterer().Register(memory); err != nil {
			return nil, err
		}
	}
	return &Scorer{name: framework.TypedName{Type: Type, Name: name}, key: framework.StateKey(Type + "/" + name), params: p, seed: maphash.MakeSeed(), agreement: a,
		peers: framework.PeersOf(h), memory: memory}, nil
}

// TypedName is the plugin's type and name in its profile.
func (s *Scorer) TypedName() framework.TypedName { return s.name }

// PromptBytes implements framework.PromptReader: hashPrompt reads whole
// blocks, at most MaxPrefixBlocksToMatch.
func (s *Scorer) PromptBytes() int {
	return s.params.HashBlockSize * s.params.MaxPrefixBlocksToMatch
}

// prefixCycle is the scorer's state for one request.
type prefixCycle struct {
	hashes  []uint64
	matched []int32
	scratch []int32
	held    []int // rendezvous: the blocks each candidate holds
	index   *prefixIndex
	// cacheMean is the pool's mean KV cache in tokens, 0 when no server
	// says, Params.LoadPerCacheSize is off or no QueueCostTokens weighs
	// load: the unit of a holder's load both in the scores and in what
	// PostPick gives the wait fit, so that the fit learns the cost of the
	// load the scores charge.
	cacheMean float64
}

// Score scores each candidate by the share of the request's prompt prefix
// it is estimated to hold in its cache.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, req *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	st, _ := cs.Reuse(s.key).(*prefixCycle)
	if st == nil {
		st = &prefixCycle{}
	}
	cs.Write(s.key, st)
	if s.peers != nil {
		st.hashes = hashPromptKeyed(s.peers.HashKey(), st.hashes[:0], cs.TargetModel, req.Prompt, s.params.HashBlockSize, s.params.MaxPrefixBlocksToMatch)
	} else {
		st.hashes = hashPrompt(s.seed, st.hashes[:0], cs.TargetModel, req.Prompt, s.params.HashBlockSize, s.params.MaxPrefixBlocksToMatch)
	}
	st.index = s.index(cs.Pool)
	st.cacheMean = 0
	// Only a holder's load against QueueCostTokens (and the fit of it)
	// reads the mean: a pool walk a pick is not paid for nothing.
	if *s.params.LoadPerCacheSize && s.params.QueueCostTokens > 0 {
		st.cacheMean = poolCacheMean(cs.Endpoints)
	}
	if len(st.hashes) == 0 || st.index == nil {
		return nil
	}
	if s.params.ServerCounterAging {
		s.ageByServers(st.index, cs.Endpoints, c)
	}
	slots := int(st.index.slots.Load())
	if cap(st.matched) < slots {
		st.matched = make([]int32, slots)
	}
	st.matched = st.matched[:slots]
	clear(st.matched)
	if st.index.match(st.hashes, st.matched, &st.scratch) > 0 {
		states := st.index.statesFor(cs.Endpoints)
		if s.params.QueueCostTokens == 0 {
			total := float64(len(st.hashes))
			for i := range c {
				scores[i] = float64(st.matchedBlocks(&c[i], states)) / total
			}
		} else {
			s.scoreAgainstLoad(st, req, c, states, scores)
		}
	}
	if !slices.ContainsFunc(scores, func(v float64) bool { return v > 0 }) {
		s.rendezvous(cs, req, c, scores, st, false)
	}
	return nil
}

// cacheMean is the pool's mean KV cache of this pick (prefixCycle), as
// Score found it.
func (s *Scorer) cacheMean(cs *framework.CycleState) float64 {
	if st, ok := cs.Read(s.key); ok {
		return st.(*prefixCycle).cacheMean
	}
	return 0
}

// batchAtPick is what loadAtPick counts e's load beyond: x's batch, with
// e's running sequences seen, under QueueCostBeyondBatch; else 0.
func (s *Scorer) batchAtPick(x *prefixIndex, e framework.Endpoint, cacheMean float64) float64 {
	if !s.params.QueueCostBeyondBatch || x == nil {
		return 0
	}
	if m := e.Metrics(); !m.IsZero() {
		x.wait.seeBatch(weighedLoad(float64(m.RunningRequests()), m, cacheMean))
	}
	return x.wait.batchSeen()
}

// seeBatches records the sequences each candidate's server was seen
// running, weighed per its share of cacheMean as load is (waitCost.seeBatch).
func (x *prefixIndex) seeBatches(c []framework.Candidate, cacheMean float64) {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			x.wait.seeBatch(weighedLoad(float64(m.RunningRequests()), m, cacheMean))
		}
	}
}

// ageByServers ages the candidates' LRUs by their servers' newest samples
// (Params.ServerCounterAging): a pointer compare per candidate when the
// sample was seen, so it costs the pick path nothing between scrapes.
func (s *Scorer) ageByServers(x *prefixIndex, set framework.EndpointSet, c []framework.Candidate) {
	states := x.statesFor(set)
	// The counters are in the servers' tokens.
	tokensPerBlock := float64(s.params.HashBlockSize) / float64(s.params.BytesPerToken) * x.recentTokenScale()
	for i := range c {
		if pe := states[c[i].Index]; pe != nil {
			pe.observeSample(c[i].Endpoint.Metrics(), tokensPerBlock)
		}
	}
}

// scoreAgainstLoad scores what each candidate's cached prefix saves beyond
// its extra load (Params.QueueCostTokens).
func (s *Scorer) scoreAgainstLoad(st *prefixCycle, req *framework.Request, c []framework.Candidate, states []*prefixEndpoint, scores []float64) {
	// In tokens: the prompt as far as it was hashed (a caller may pass only
	// PromptBytes of it), and what each endpoint's cached prefix saves.
	promptTokens := float64(min(len(req.Prompt), s.PromptBytes())) / float64(s.params.BytesPerToken)
	blockTokens := float64(s.params.HashBlockSize) / float64(s.params.BytesPerToken)
	s.weighAgainstLoad(st.index, st.index, states, c, st.cacheMean, promptTokens, func(i int) (float64, bool) {
		matched := float64(st.matchedBlocks(&c[i], states))
		return matched * blockTokens, matched > 0
	}, scores)
}

// weighAgainstLoad scores each candidate whose cached tokens cachedTokens
// reports (ok false: left as it is) by what they save of promptTokens less
// QueueCostTokens per request of its extra load (and, with
// QueueCostBeyondBatch, a second cost per request beyond the batch),
// counted per its server's share of cacheMean (weighedLoad); x, when not
// nil, is the index whose recent misses QueueMissCost counts; room, when
// not nil, is the index whose live blocks QueueCostTokensWithRoom weighs
// against the candidates' capacity and whose fit QueueCostFromServers
// reads, states its endpoint states aligned with the pick's endpoint set.
func (s *Scorer) weighAgainstLoad(x, room *prefixIndex, states []*prefixEndpoint, c []framework.Candidate, cacheMean, promptTokens float64, cachedTokens func(i int) (float64, bool), scores []float64) {
	load := func(i int) float64 {
		return weighedLoad(float64(candidateLoad(&c[i])), c[i].Metrics, cacheMean)
	}
	if room != nil && s.params.QueueCostBeyondBatch {
		room.seeBatches(c, cacheMean)
	}
	least, running := math.Inf(1), 1
	for i := range c {
		least = min(least, load(i))
		if m := c[i].Metrics; !m.IsZero() {
			running = max(running, m.RunningRequests())
		}
	}
	// When every endpoint is busy, a miss also delays everything queued
	// behind its prefill at the other endpoint, and it evicts a prefix
	// there: the extra load a holder may carry grows with the least load,
	// counted in batches (the most sequences an endpoint was seen running).
	// Without this, affinity gives way under overload, each miss adds load,
	// and the pool falls to round-robin's hit rate.
	perRequest, perQueued := s.queueCost(room, states, c)
	perRequest /= 1 + least/float64(running)
	perQueued /= 1 + least/float64(running)
	if s.params.QueueMissCost && x != nil {
		// Not divided like the above: when the pool misses anyway, a miss
		// here evicts little that would have hit, and every request
		// queued ahead costs its prefill.
		perRequest += x.recentMissShare() * promptTokens / float64(running)
	}
	// cost is what candidate i's load costs in tokens: perRequest a
	// request, and perQueued more a request beyond the batch
	// (QueueCostBeyondBatch).
	cost := func(i int) float64 { return perRequest * load(i) }
	if perQueued > 0 {
		batch := room.wait.batchSeen()
		cost = func(i int) float64 {
			l := load(i)
			return perRequest*l + perQueued*max(l-batch, 0)
		}
	}
	leastCost := math.Inf(1)
	for i := range c {
		leastCost = min(leastCost, cost(i))
	}
	for i := range c {
		cached, ok := cachedTokens(i)
		if !ok {
			continue
		}
		saved := cached - (cost(i) - leastCost)
		scores[i] = saved / promptTokens
	}
}

// roomFill is the share of the candidates' LRUs, together, that their
// live blocks may fill for the pool's caches to have room
// (Params.QueueCostTokensWithRoom).
const roomFill = 0.4

// queueCost is the prompt tokens one request of a holder's extra load
// costs: QueueCostTokensWithRoom while the candidates' live blocks in x
// (those a later prompt found again: prefixes in use, not the tails of
// single prompts) fill at most roomFill of their LRUs together,
// QueueCostTokens otherwise; with QueueCostFromServers, what x's servers
// show it costs, in x's tokens, scaled alike. queued is what one beyond
// the batch costs besides (QueueCostBeyondBatch; 0 until the fit has
// it), scaled alike. states are x's endpoint states aligned with the
// pick's endpoint set.
func (s *Scorer) queueCost(x *prefixIndex, states []*prefixEndpoint, c []framework.Candidate) (perRequest, queued float64) {
	withRoom, withoutRoom := float64(s.params.QueueCostTokensWithRoom), float64(s.params.QueueCostTokens)
	// queuedPer is queued per unit of the cost a request.
	var queuedPer float64
	if x != nil && s.params.QueueCostFromServers {
		if learned, beyond, ok := x.wait.tokensPerRequest(); ok {
			if s.params.QueueCostBeyondBatch {
				queuedPer = beyond / learned
			}
			learned /= x.recentTokenScale()
			if withRoom > 0 {
				withRoom, withoutRoom = learned, learned*withoutRoom/withRoom
			} else {
				withoutRoom = learned
			}
		}
	}
	if withRoom == 0 || x == nil {
		return withoutRoom, withoutRoom * queuedPer
	}
	var live, capacity int64
	for i := range c {
		capacity += int64(s.capacity(x, c[i].Metrics))
		if c[i].Index < len(states) {
			if pe := states[c[i].Index]; pe != nil && !pe.dead.Load() {
				live += pe.live.Load()
			}
		}
	}
	if float64(live) <= roomFill*float64(capacity) {
		return withRoom, withRoom * queuedPer
	}
	return withoutRoom, withoutRoom * queuedPer
}

// rendezvous scores RendezvousScore for the candidate every replica would
// choose for the prompt (see Params.RendezvousBlocks): the highest
// rendezvous weight of the prompt's leading blocks and the candidate's
// address among those within RendezvousLoadSlack of the least load. The
// hash is fixed, not the scorer's seed, so that every replica agrees; a
// crafted prompt can only choose which endpoint it lands on, which any
// client can do by sending load there.
//
// heldNowhere says the prompt is known, from a truer source than the
// index (a precise scorer's events), to be held on no candidate; false:
// the index is asked.
func (s *Scorer) rendezvous(cs *framework.CycleState, req *framework.Request, c []framework.Candidate, scores []float64, st *prefixCycle, heldNowhere bool) {
	if s.params.RendezvousBlocks == 0 || len(c) == 0 {
		return
	}
	n := min(len(req.Prompt)/s.params.HashBlockSize, s.params.RendezvousBlocks) * s.params.HashBlockSize
	if n == 0 {
		return
	}
	key := fnvBytes(fnvString(fnvOffset, cs.TargetModel), req.Prompt[:n])
	least := int64(math.MaxInt64)
	var own, scraped int64
	for i := range c {
		least = min(least, candidateLoad(&c[i]))
		if m := c[i].Metrics; !m.IsZero() {
			own += max(c[i].Endpoint.InFlight(), 0)
			scraped += int64(m.RunningRequests() + m.WaitingRequests())
		}
	}
	slack := int64(s.params.RendezvousLoadSlack)
	if s.params.RendezvousSlackPerReplica {
		if x := s.index(cs.Pool); x != nil {
			x.observeLoadShare(own, scraped)
			slack *= int64(x.replicas())
		}
	}
	// newPrefix: the prompt is held on no candidate (asked only by
	// RendezvousNeedsRoom and RendezvousBalanceNewPrefix).
	var states []*prefixEndpoint
	newPrefix := false
	if st != nil && st.index != nil && (s.params.RendezvousBalanceCache || s.params.RendezvousNeedsRoom) {
		states = st.index.statesFor(cs.Endpoints)
		if s.params.RendezvousNeedsRoom || s.params.RendezvousBalanceNewPrefix {
			newPrefix = heldNowhere || !st.heldByAny(states, c)
		}
	}
	// With RendezvousBalanceCache, held is the blocks each candidate's LRU
	// holds (nil: not bounded by them), minHeld the fewest of those within
	// the slack.
	var held []int
	minHeld := math.MaxInt
	even := s.params.RendezvousBalanceEven
	if s.params.RendezvousBalanceCache && states != nil {
		// perMeanCache weighs held blocks per share of the mean cache
		// (RendezvousBalanceEven).
		perMeanCache := newCacheWeights(c, even)
		held = slices.Grow(st.held[:0], len(c))[:len(c)]
		st.held = held
		for i := range c {
			held[i] = 0
			if n, ok := s.heldElsewhere(cs.Pool, c[i].Endpoint); ok {
				held[i] = n
			} else if pe := states[c[i].Index]; pe != nil && !pe.dead.Load() {
				held[i] = pe.heldBlocks()
			}
			if even {
				held[i] = int(float64(held[i]) * perMeanCache.mean / perMeanCache.of(&c[i]))
			}
			if candidateLoad(&c[i])-least <= slack {
				minHeld = min(minHeld, held[i])
			}
		}
	}
	// A candidate may hold at most beyond blocks more than minHeld.
	beyond := min(len(req.Prompt)/s.params.HashBlockSize, s.params.MaxPrefixBlocksToMatch)
	switch {
	case s.params.RendezvousBalanceNewPrefix && newPrefix && minHeld < beyond/2:
		beyond /= 2
	case even:
		beyond--
	}
	eligible := func(i int) bool {
		return candidateLoad(&c[i])-least <= slack && (held == nil || held[i]-minHeld <= beyond)
	}
	// With RendezvousNeedsRoom, a candidate is full whose load reaches the
	// most sequences a server was seen running (both weighed as load is),
	// and full ones are passed over while an eligible one is not, for a
	// prompt no candidate holds a block of: one a holder gives up for its
	// load spills where the hash says, not to a copy on every server with
	// a free sequence in turn.
	full := func(int) bool { return false }
	if s.params.RendezvousNeedsRoom && newPrefix {
		full = fullWhileRoom(st.index, c, st.cacheMean, eligible)
	}
	sizes := newCacheWeights(c, *s.params.RendezvousByCacheSize)
	best, bestWeight := -1, 0.0
	for i := range c {
		if !eligible(i) || full(i) {
			continue
		}
		h := chainHash(key, fnvString(fnvOffset, c[i].Endpoint.Address()))
		// Weighted rendezvous hashing: with u uniform in (0, 1), the
		// candidate of the highest -size/ln(u) is each candidate with
		// odds in proportion to its size; with equal sizes, the highest
		// hash as unweighted.
		u := (float64(h>>11) + 0.5) / (1 << 53)
		w := -sizes.of(&c[i]) / math.Log(u)
		if best < 0 || w > bestWeight {
			best, bestWeight = i, w
		}
	}
	scores[best] = max(scores[best], RendezvousScore)
}

// fullWhileRoom returns whether candidate i's server has no free sequence
// (its load, weighed per its share of cacheMean, reaches the most
// sequences a server of the pool was seen running, both as
// RendezvousNeedsRoom counts them) while an alternative (a candidate
// alternative says may take the prompt instead) has one; when none has,
// no candidate is full, and the prompt goes where it would without.
func fullWhileRoom(x *prefixIndex, c []framework.Candidate, cacheMean float64, alternative func(i int) bool) func(i int) bool {
	x.seeBatches(c, cacheMean)
	batch := x.wait.batchSeen()
	atBatch := func(i int) bool {
		return weighedLoad(float64(candidateLoad(&c[i])), c[i].Metrics, cacheMean) >= batch
	}
	for i := range c {
		if alternative(i) && !atBatch(i) {
			return atBatch
		}
	}
	return func(int) bool { return false }
}

// rendezvousHeldNowhere scores the rendezvous choice for a prompt known
// to be held on no candidate, after Score of the same pick.
func (s *Scorer) rendezvousHeldNowhere(cs *framework.CycleState, req *framework.Request, c []framework.Candidate, scores []float64) {
	st, _ := cs.Read(s.key)
	pc, _ := st.(*prefixCycle)
	s.rendezvous(cs, req, c, scores, pc, true)
}

func (s *Scorer) heldElsewhere(pool framework.Pool, e framework.Endpoint) (int, bool) {
	if s.heldBlocks == nil {
		return 0, false
	}
	return s.heldBlocks(pool, e)
}

// cacheWeights weighs candidates by their servers' KV caches in tokens: a
// server that has not said weighs as the mean of those that have, and
// every one weighs 1 when none has or the weighing is off. Computed on
// demand, it allocates nothing on the pick's path.
type cacheWeights struct {
	on   bool
	mean float64
}

func newCacheWeights(c []framework.Candidate, on bool) cacheWeights {
	w := cacheWeights{on: on, mean: 1}
	if !on {
		return w
	}
	var sum float64
	var known int
	for i := range c {
		if size, ok := knownCacheSize(&c[i]); ok {
			sum += size
			known++
		}
	}
	if known > 0 {
		w.mean = sum / float64(known)
	}
	return w
}

// of is c's weight.
func (w cacheWeights) of(c *framework.Candidate) float64 {
	if w.on {
		if size, ok := knownCacheSize(c); ok {
			return size
		}
	}
	return w.mean
}

// poolCacheMean is the mean KV cache in tokens of set's servers that say,
// 0 when none does.
func poolCacheMean(set framework.EndpointSet) float64 {
	var sum float64
	var known int
	for _, e := range framework.All(set) {
		if size, ok := metricsCacheSize(e.Metrics()); ok {
			sum += size
			known++
		}
	}
	if known == 0 {
		return 0
	}
	return sum / float64(known)
}

// weighedLoad is load on a server whose metrics are m, per its share of
// cacheMean (Params.LoadPerCacheSize): a request ahead on a server of
// twice the mean cache, and twice the sequences, delays less. Unweighed
// when cacheMean is 0 or m does not say.
func weighedLoad(load float64, m framework.Metrics, cacheMean float64) float64 {
	if size, ok := metricsCacheSize(m); ok && cacheMean > 0 {
		return load * cacheMean / size
	}
	return load
}

// knownCacheSize is c's server's KV cache in tokens, if its metrics say.
func knownCacheSize(c *framework.Candidate) (float64, bool) { return metricsCacheSize(c.Metrics) }

// metricsCacheSize is the KV cache in tokens m says its server has, if it
// says.
func metricsCacheSize(m framework.Metrics) (float64, bool) {
	if !m.IsZero() && m.NumBlocks() > 0 && m.BlockSize() > 0 {
		return float64(m.NumBlocks()) * float64(m.BlockSize()), true
	}
	return 0, false
}

// FNV-1a, 64-bit: a fixed hash, the same in every process.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return h
}

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// ObserveCachedTokens implements framework.CachePredictionObserver: it
// compares what PostPick predicted for the primary endpoint with the cached
// tokens the server reported. When the server had less than predicted by
// more than a block's rounding (the server's block, and the index's), the
// blocks the endpoint's LRU holds that were used before the least recent
// predicted one are dropped: the server evicts least recently used first,
// so they are gone too. With peers, the blocks dropped are forgotten there
// too (Peers.ForgetBlocks): they recorded the same picks, and would
// otherwise keep believing what the server lost until their own requests
// missed on it.
//
// The prediction is in the index's estimate of tokens (BytesPerToken);
// the report in the server's, which the server counts too
// (ReportedPromptTokens): a whole prompt's report scales the estimate to
// the server's tokens, and the pool's recent scale does for a prompt the
// index saw only the start of.
func (s *Scorer) ObserveCachedTokens(p *framework.CachePrediction, cachedTokens int) {
	pe, _ := p.Ref.(*prefixEndpoint)
	if pe == nil || cachedTokens < 0 {
		return
	}
	scale := s.tokenScale(pe.idx, p)
	blockTokens := float64(s.params.HashBlockSize) / float64(s.params.BytesPerToken) * scale
	predicted := int(math.Round(float64(p.PredictedTokens) * scale))
	promptTokens := p.PromptTokens
	if p.ReportedPromptTokens > 0 {
		promptTokens = p.ReportedPromptTokens
	}
	if promptTokens > 0 {
		pe.idx.observeMiss(1 - min(float64(cachedTokens)/float64(promptTokens), 1))
	}
	s.observeWait(pe.idx, p, cachedTokens)
	s.agreement.observed.Inc()
	s.agreement.predictedTokens.Add(float64(predicted))
	s.agreement.confirmedTokens.Add(float64(min(cachedTokens, predicted)))
	if s.params.ServerCounterAging {
		// What the server computed for this request is what the index
		// added for it, plus the predicted blocks it did not have, less
		// the blocks the index added that it did have: the request's own,
		// not another replica's.
		pe.correctAdded(float64(predicted-min(cachedTokens, promptTokens)) / blockTokens)
	}
	slack := 2 * max(int(math.Round(blockTokens)), 16)
	if cachedTokens+slack >= predicted {
		return
	}
	s.agreement.overPredicted.Inc()
	if !*s.params.UsageFeedback {
		return
	}
	if s.peers == nil {
		pe.forgetUsedBefore(p.Mark, nil)
		return
	}
	var dropped []uint64
	pe.forgetUsedBefore(p.Mark, &dropped)
	if len(dropped) > 0 {
		// The most recent of them matter most (the least recent go first
		// from the peers' LRUs too): at most a record's worth.
		s.peers.ForgetBlocks(pe.pool, pe.endpoint, dropped[max(len(dropped)-maxForgetBlocks, 0):])
	}
}

// observeWait folds a response into x's fit of what a request ahead
// costs (Params.QueueCostFromServers), when the server counted the
// prompt's tokens: the uncached are the prompt's less the cached, both in
// the server's tokens.
func (s *Scorer) observeWait(x *prefixIndex, p *framework.CachePrediction, cachedTokens int) {
	if !s.params.QueueCostFromServers || x == nil || p.ReportedPromptTokens <= 0 {
		return
	}
	x.wait.observe(max(p.ReportedPromptTokens-cachedTokens, 0), p.LoadAtPick, p.QueuedAtPick, p.ReportedTTFT)
}

// maxForgetBlocks bounds the blocks one report makes the peers forget (and
// one peer's record makes this index forget): as many as a peer-sync
// record carries.
const maxForgetBlocks = 1 << 12

// Bounds of the servers' tokens over the index's estimate: beyond them a
// report is not of the same prompt (or not of a tokenizer), and counts as
// the bound.
const (
	minTokenScale = 1.0 / 8
	maxTokenScale = 8.0
)

// tokenScale is the servers' tokens over the index's estimate for p's
// report: the report's own when the index saw the whole prompt (folded
// into the pool's), the pool's recent scale when it saw only its start, 1
// without a report of the prompt's tokens.
func (s *Scorer) tokenScale(x *prefixIndex, p *framework.CachePrediction) float64 {
	if p.ReportedPromptTokens <= 0 || p.PromptTokens <= 0 {
		return 1
	}
	if p.PromptTokens >= s.PromptBytes()/s.params.BytesPerToken {
		return x.recentTokenScale() // the prompt may go on past what was hashed
	}
	scale := min(max(float64(p.ReportedPromptTokens)/float64(p.PromptTokens), minTokenScale), maxTokenScale)
	x.observeTokenScale(scale)
	return scale
}

// heldByAny reports whether the index holds a block of the prompt on any
// candidate.
func (st *prefixCycle) heldByAny(states []*prefixEndpoint, c []framework.Candidate) bool {
	for i := range c {
		if st.matchedBlocks(&c[i], states) > 0 {
			return true
		}
	}
	return false
}

// matchedBlocks is how many leading blocks of the prompt the candidate is
// believed to hold.
func (st *prefixCycle) matchedBlocks(c *framework.Candidate, states []*prefixEndpoint) int32 {
	if pe := states[c.Index]; pe != nil && int(pe.slot) < len(st.matched) && !pe.dead.Load() {
		return st.matched[pe.slot]
	}
	return 0
}

// candidateLoad is the requests in flight on the candidate: poolpicker's own
// count, exact and current, or the scraped running and waiting requests when
// they say more (requests another picker replica sent); plus those flow
// control holds for it in the picker (Candidate.Held).
func candidateLoad(c *framework.Candidate) int64 {
	n := max(c.Endpoint.InFlight(), 0)
	if m := c.Metrics; !m.IsZero() {
		n = max(n, int64(m.RunningRequests()+m.WaitingRequests()))
	}
	return n + c.Held
}

// PostPick records the prompt's blocks in the primary endpoint's LRU, and
// leaves on the Result what the index predicted there, for the server's
// report of cached tokens to check (Result.ObserveCachedTokens).
func (s *Scorer) PostPick(_ context.Context, cs *framework.CycleState, req *framework.Request, res *framework.Result) {
	v, _ := cs.Read(s.key)
	st, ok := v.(*prefixCycle)
	if !ok || len(res.Endpoints) == 0 || len(st.hashes) == 0 || st.index == nil {
		return
	}
	e := res.Endpoints[0]
	capacity := s.capacity(st.index, e.Metrics())
	if pe := st.index.endpointFor(cs.Pool, e, capacity); pe != nil {
		var predicted int32
		if int(pe.slot) < len(st.matched) {
			predicted = st.matched[pe.slot]
		}
		watermark := pe.record(st.hashes, capacity, int(predicted))
		p := framework.CachePrediction{Observer: s, Ref: pe, Mark: watermark,
			PredictedTokens: int(predicted) * (s.params.HashBlockSize / s.params.BytesPerToken),
			PromptTokens:    min(len(req.Prompt), s.PromptBytes()) / s.params.BytesPerToken}
		if s.params.QueueCostFromServers {
			p.LoadAtPick, p.QueuedAtPick = loadAtPick(e, st.cacheMean, s.batchAtPick(st.index, e, st.cacheMean))
		}
		res.Predict(p)
		if s.peers != nil {
			s.peers.ShareBlocks(cs.Pool, e, st.hashes)
		}
	}
	// The state is recycled with the CycleState: do not pin the index of a
	// pool that may be removed.
	st.index = nil
}

// LearnPeerBlocks implements framework.PeerLearner: a peer replica's pick
// sent the prompt to e, so e's LRU records its blocks as this replica's
// own pick would have. At most MaxPrefixBlocksToMatch blocks count, so a
// peer can make an LRU hold only what a prompt could.
func (s *Scorer) LearnPeerBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	x := s.index(pool)
	if x == nil {
		return
	}
	blocks = blocks[:min(len(blocks), s.params.MaxPrefixBlocksToMatch)]
	capacity := s.capacity(x, e.Metrics())
	if pe := x.endpointFor(pool, e, capacity); pe != nil {
		pe.record(blocks, capacity, 0)
	}
}

// ForgetPeerBlocks implements framework.PeerForgetter: a peer replica's
// server report said e no longer caches the blocks, so e's LRU drops
// those it holds. At most maxForgetBlocks count, and only an index and an
// LRU that exist are touched: a peer can make this index forget, never
// believe more.
func (s *Scorer) ForgetPeerBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	v, ok := s.indexes.Load(pool)
	if !ok || len(blocks) == 0 {
		return
	}
	if pe := v.(*prefixIndex).lookup(e.Key()); pe != nil {
		pe.forget(blocks[:min(len(blocks), maxForgetBlocks)])
	}
}

// capacity is the number of blocks an endpoint's LRU in index x holds:
// the server's KV cache in prompt bytes over the block size, when the
// server says how big its cache is; LRUCapacityPerServer otherwise. The
// cache's tokens are the servers' (TokenScaledCapacity): at a scale of
// the servers' tokens to the estimate below 1 (longer words than
// BytesPerToken) a server holds more of the prompts' bytes than the
// estimate's tokens say, and the LRU would forget prefixes the server
// still holds.
func (s *Scorer) capacity(x *prefixIndex, m framework.Metrics) int {
	if *s.params.AutoTune && !m.IsZero() && m.NumBlocks() > 0 && m.BlockSize() > 0 {
		c := float64(m.NumBlocks()) * float64(m.BlockSize()) * float64(s.params.BytesPerToken) / float64(s.params.HashBlockSize)
		if *s.params.TokenScaledCapacity {
			c /= x.recentTokenScale()
		}
		return int(min(max(c, 1), float64(s.params.MaxLRUCapacityPerServer)))
	}
	return s.params.LRUCapacityPerServer
}

// index returns the pool's index, creating it unless the pool is removed.
func (s *Scorer) index(pool framework.Pool) *prefixIndex {
	if v, ok := s.indexes.Load(pool); ok {
		return v.(*prefixIndex)
	}
	if pool.Removed() {
		return nil
	}
	key := pool.Key()
	v, loaded := s.indexes.LoadOrStore(pool, newPrefixIndex(s.memory.Party(key.Namespace, key.Name)))
	x := v.(*prefixIndex)
	if !loaded && pool.Removed() {
		// PoolRemoved ran between the check and the store; undo.
		s.indexes.Delete(pool)
		x.markRemoved()
	}
	return x
}

// EndpointsChanged drops the LRUs and index entries of endpoints that left.
func (s *Scorer) EndpointsChanged(pool framework.Pool, _, removed []framework.Endpoint) {
	if len(removed) == 0 {
		return
	}
	if v, ok := s.indexes.Load(pool); ok {
		v.(*prefixIndex).drop(removed)
	}
}

// PoolRemoved drops the pool's whole index.
func (s *Scorer) PoolRemoved(pool framework.Pool) {
	if v, ok := s.indexes.LoadAndDelete(pool); ok {
		v.(*prefixIndex).markRemoved()
	}
	s.memory.Forget(pool.Key().Namespace, pool.Key().Name)
}

// hashPrompt appends to dst the chained hashes of the prompt's whole blocks,
// at most maxBlocks of them. A trailing partial block is not hashed: the
// server caches whole blocks too, and the next request's longer prompt
// would hash it differently anyway. Each block is hashed alone and mixed
// into the previous block's chained hash (the first into the model's), with
// the runtime's hash (AES-based where the CPU has it): 256 blocks cost
// 1.7 us, against 3.7 us with xxhash.
func hashPrompt(seed maphash.Seed, dst []uint64, model string, prompt []byte, blockSize, maxBlocks int) []uint64 {
	n := min(len(prompt)/blockSize, maxBlocks)
	if n == 0 {
		return dst
	}
	prev := maphash.String(seed, model)
	for i := 0; i < n; i++ {
		prev = chainHash(prev, maphash.Bytes(seed, prompt[i*blockSize:(i+1)*blockSize]))
		dst = append(dst, prev)
	}
	return dst
}

// hashPromptKeyed is hashPrompt with xxhash64 seeded by key in place of
// the runtime's hash, whose seed cannot be shared: the hashes peer
// replicas exchange must agree across processes, and a key that clients
// do not know keeps them from crafting prompts whose blocks collide.
func hashPromptKeyed(key uint64, dst []uint64, model string, prompt []byte, blockSize, maxBlocks int) []uint64 {
	n := min(len(prompt)/blockSize, maxBlocks)
	if n == 0 {
		return dst
	}
	var d xxhash.Digest
	d.ResetWithSeed(key)
	_, _ = d.WriteString(model)
	prev := d.Sum64()
	for i := 0; i < n; i++ {
		d.ResetWithSeed(key)
		_, _ = d.Write(prompt[i*blockSize : (i+1)*blockSize])
		prev = chainHash(prev, d.Sum64())
		dst = append(dst, prev)
	}
	return dst
}

// chainHash mixes a block's hash into the chain so far: an invertible
// multiply-xorshift finalizer (MurmurHash3's fmix64) over both, so a change
// to either changes every bit of the result with even odds.
func chainHash(prev, block uint64) uint64 {
	x := prev*0x9E3779B97F4A7C15 ^ block
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
