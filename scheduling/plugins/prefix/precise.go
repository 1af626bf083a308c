// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/kvevents"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/tokenize"
)

// PreciseType is the precise prefix-cache scorer's type name, llm-d's.
const PreciseType = "precise-prefix-cache-scorer"

// Defaults of the precise scorer's parameters (llm-d's where it has them).
const (
	DefaultPreciseBlockSize  = 16
	DefaultKVEventsPort      = 5557
	DefaultMaxPromptBytes    = 1 << 20
	DefaultMaxPreciseBlocks  = 1 << 13
	defaultTokenizerBackend  = TokenizerRender
	TokenizerRender          = "render"
	TokenizerEstimate        = "estimate"
	MetricTokenizeFallbacks  = "poolpicker_prefix_cache_tokenize_fallbacks_total"
	MetricEvictedAfterPick   = "poolpicker_prefix_cache_evicted_after_pick_tokens_total"
	maxPreciseBlockSize      = 1 << 12
	maxPreciseTokenizerTimer = time.Second
	// DefaultSpeculativeTTL is how long a pick's blocks count on its
	// endpoint before its events store them (speculativeTTL), llm-d's.
	DefaultSpeculativeTTL = 2 * time.Second
	maxSpeculativeTTL     = time.Minute
)

// DefaultLearnedParams are the learned index's parameters when a precise
// scorer's config gives none (approximate absent, as in llm-d's precise
// configuration): the default profile's prefix-cache-scorer's (a test of
// package scheduling keeps the two alike), so that the events' matches are
// weighed against load, and new prefixes placed, by the rules the default
// profile routes by; and two rules for new prefixes that the default
// profile leaves off, measured with the events: rendezvousNeedsRoom, which
// shortened precise routing's TTFT where the prefixes do not fit the
// caches, and rendezvousBalanceNewPrefix, which kept four chat system
// prompts on four servers.
const DefaultLearnedParams = `{"hashBlockSize": 64, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250,
 "queueCostTokens": 192, "queueCostTokensWithRoom": 384, "rendezvousBlocks": 4, "rendezvousLoadSlack": 8,
 "rendezvousBalanceCache": true, "queueCostFromServers": true, "rendezvousNeedsRoom": true,
 "rendezvousBalanceNewPrefix": true}`

// The local tokenizer backend: tokenizer.json files found as llm-d's
// tokenizersPoolConfig.local says, DefaultLocalTokenizerDir when its local
// block names no directory.
const (
	TokenizerLocal           = "local"
	DefaultLocalTokenizerDir = "/mnt/models"
)

// PreciseParams are the precise scorer's parameters: llm-d's
// precise-prefix-cache-scorer's (tokenProcessorConfig, kvEventsConfig,
// indexerConfig, speculativeIndexing) with the same meaning, and
// poolpicker's own (tokenizer, approximate, the bounds).
type PreciseParams struct {
	TokenProcessorConfig *struct {
		// BlockSize and BlockSizeTokens (its newer name) are the tokens per
		// block, as the model servers' --block-size. Zero: 16.
		BlockSize       int `json:"blockSize"`
		BlockSizeTokens int `json:"blockSizeTokens"`
		// HashSeed is the servers' --hash-seed (vLLM's PYTHONHASHSEED).
		HashSeed string `json:"hashSeed"`
		// HashAlgorithm is "cbor-fnv" (empty) or "xxh64".
		HashAlgorithm string `json:"hashAlgorithm"`
	} `json:"tokenProcessorConfig"`
	KVEventsConfig *struct {
		// ZMQEndpoint, when set, is where the picker binds a SUB socket for
		// servers that dial it (e.g. "tcp://*:5557").
		ZMQEndpoint string `json:"zmqEndpoint"`
		// TopicFilter is the topic prefix subscribed to. Empty: "kv@".
		TopicFilter string `json:"topicFilter"`
		// Concurrency is accepted; each endpoint has its own reader.
		Concurrency int `json:"concurrency"`
		// EngineType is "vllm" (empty) or "sglang": the same format.
		EngineType string `json:"engineType"`
		// DiscoverPods dials each served endpoint's publisher at
		// PodDiscoveryConfig.SocketPort. Absent: true.
		DiscoverPods       *bool `json:"discoverPods"`
		PodDiscoveryConfig *struct {
			// PodLabelSelector and PodNamespace are accepted: the pool's
			// endpoints are the pods subscribed to.
			PodLabelSelector string `json:"podLabelSelector"`
			PodNamespace     string `json:"podNamespace"`
			// SocketPort is the publishers' port. Zero: 5557.
			SocketPort int `json:"socketPort"`
			// ReplaySocketPort is the replay sockets' port. Zero: no
			// replay.
			ReplaySocketPort int `json:"replaySocketPort"`
		} `json:"podDiscoveryConfig"`
	} `json:"kvEventsConfig"`
	// IndexerConfig is accepted; poolpicker's index is in memory and
	// bounded by the parameters below. Of it, tokenizersPoolConfig's
	// minPrefixOverlapRatio and local tokenizers are read (llmdTokenizers).
	IndexerConfig json.RawMessage `json:"indexerConfig"`
	// SpeculativeIndexing counts a pick's prompt blocks on the endpoint
	// picked from the pick until its events store them, at most
	// SpeculativeTTL: a prompt of the same prefix picked meanwhile then
	// finds them there, as it would in the learned index, and new
	// prefixes are balanced by them (rendezvousBalanceCache). Absent: true,
	// where llm-d's default is false: on unequal servers, in the routing
	// sweep on llm-d's simulator, it kept the hit rate and the tail that
	// waiting for the events cost. SpeculativeTTL is a duration ("2s");
	// empty: 2s, at most 1m.
	SpeculativeIndexing *bool  `json:"speculativeIndexing"`
	SpeculativeTTL      string `json:"speculativeTTL"`

	// Tokenizer says how a prompt becomes token ids.
	Tokenizer *struct {
		// Backend is "render" (the default: the model server's render
		// endpoint, or a local tokenizer for the models that have one),
		// "local" (local tokenizers only: indexerConfig's
		// tokenizersPoolConfig.local), or "estimate" (no tokens: the
		// learned index alone).
		Backend string `json:"backend"`
		// URL is the render server. Empty: the candidate endpoint.
		URL string `json:"url"`
		// ModelName is the base model whose tokenizer reads the prompts
		// (llm-d's token-producer modelName): the model named in the
		// render request and the local tokenizer used, whatever adapter
		// the request names. A model server renders for its base model
		// only (vLLM's render endpoints refuse a LoRA adapter's name);
		// the block keys still take the request's model, as the server
		// keys an adapter's blocks. Empty: the request's model.
		ModelName string `json:"modelName"`
		// Timeout bounds the round trip; past it the pick scores from the
		// learned index ("50ms"). Empty: 50ms, at most 1s.
		Timeout string `json:"timeout"`
		// CacheEntries is how many prompts' tokens are cached. Zero: 4096.
		CacheEntries int `json:"cacheEntries"`
	} `json:"tokenizer"`
	// Approximate are the parameters of the learned index (a
	// prefix-cache-scorer's) that scores endpoints without events, and
	// whose rules AffinityRules applies. Absent: DefaultLearnedParams, the
	// default profile's; given, they replace those whole.
	Approximate json.RawMessage `json:"approximate"`
	// MaxBlocksPerEndpoint bounds the blocks indexed per endpoint. Zero:
	// 1<<20.
	MaxBlocksPerEndpoint int `json:"maxBlocksPerEndpoint"`
	// MaxMessageBytes bounds a KV-event message. Zero: 4 MiB.
	MaxMessageBytes int `json:"maxMessageBytes"`
	// EventsPerSecond bounds the events applied per endpoint per second.
	// Zero: 20000.
	EventsPerSecond float64 `json:"eventsPerSecond"`
	// MaxPromptBytes is the longest prompt tokenized. Zero: 1 MiB.
	MaxPromptBytes int `json:"maxPromptBytes"`
	// AffinityRules scores the events' matches by the learned index's
	// rules (its Approximate parameters): a holder's cached tokens, in the
	// learned index's estimate of them, less queueCostTokens per request
	// of its extra load; a prompt no candidate is worth sending to for its
	// cache, by the blocks the candidates hold or their servers' events
	// removed recently, weighed alike (every replica reads the same
	// events, so every replica sends an evicted prefix back to the server
	// that last held it); and a prompt still unplaced, by the learned
	// index (where it last sent the prefix, else the rendezvous choice,
	// which every replica makes alike). False: the share of the prompt's
	// blocks held, whatever the load, and by load for a prompt nobody
	// holds: a hot prefix then queues on its holder, and where the
	// prefixes do not fit each server caches every prefix in turn (the
	// routing sweep on llm-d's simulator, site-src/performance.md).
	// Absent: true.
	AffinityRules *bool `json:"affinityRules"`
}

// Precise scores an endpoint by the share of the prompt's leading token
// blocks its model server holds according to its KV-cache events (package
// kvevents): the prompt is tokenized by a model server's render endpoint
// and keyed as the servers key their blocks. An endpoint whose events are
// not (yet) its server's whole history (none published, a gap that could not
// be replayed), and every endpoint when the prompt cannot be tokenized in
// time, is scored by the learned index of an approximate Scorer, which keeps
// learning from picks all along.
type Precise struct {
	name      framework.TypedName
	key       framework.StateKey
	approx    *Scorer
	hasher    *kvevents.Hasher
	events    *kvevents.Manager
	tokenizer *tokenize.Renderer
	renderURL string
	// baseModel: PreciseParams.Tokenizer.ModelName.
	baseModel string
	maxPrompt int
	maxBlocks int
	// affinityRules: PreciseParams.AffinityRules.
	affinityRules bool
	// speculativeTTL is how long a pick's blocks count on its endpoint
	// before its events store them (PreciseParams.SpeculativeIndexing);
	// zero: not at all.
	speculativeTTL time.Duration
	agreement      agreement
	fallbacks      *prometheus.CounterVec
	// evictedAfterPick counts the predicted tokens the servers did not
	// report cached because their events removed the blocks after the pick.
	evictedAfterPick prometheus.Counter

	// start starts the subscriptions' manager when the first endpoint
	// arrives, under the handle's context: a config is also built once to
	// check it, and that instance must not bind or dial anything.
	start func()

	mu    sync.Mutex
	pools map[framework.PoolKey]map[string]struct{} // endpoint addresses
}

var (
	_ framework.Scorer                  = (*Precise)(nil)
	_ framework.PostPicker              = (*Precise)(nil)
	_ framework.PromptReader            = (*Precise)(nil)
	_ framework.CachePredictionObserver = (*Precise)(nil)
	_ framework.PoolObserver            = (*Precise)(nil)
	_ framework.PeerLearner             = (*Precise)(nil)
	_ framework.PeerForgetter           = (*Precise)(nil)
)

// NewPrecise is the factory of precise-prefix-cache-scorer.
func NewPrecise(name string, raw json.RawMessage, h framework.Handle) (framework.Plugin, error) {
	var p PreciseParams
	if err := framework.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	blockSize, seed, alg := DefaultPreciseBlockSize, "", ""
	if t := p.TokenProcessorConfig; t != nil {
		blockSize = max(t.BlockSizeTokens, 0)
		if blockSize == 0 {
			blockSize = t.BlockSize
		}
		if blockSize == 0 {
			blockSize = DefaultPreciseBlockSize
		}
		seed, alg = t.HashSeed, t.HashAlgorithm
	}
	if blockSize < 1 || blockSize > maxPreciseBlockSize {
		return nil, fmt.Errorf("parameters: tokenProcessorConfig.blockSize %d must be between 1 and %d", blockSize, maxPreciseBlockSize)
	}
	hasher, err := kvevents.NewHasher(blockSize, seed, alg)
	if err != nil {
		return nil, fmt.Errorf("parameters: tokenProcessorConfig: %w", err)
	}
	approxName := name + "-approximate"
	learnedParams := p.Approximate
	if len(learnedParams) == 0 || string(learnedParams) == "null" {
		learnedParams = json.RawMessage(DefaultLearnedParams)
	}
	a, err := New(approxName, learnedParams, h)
	if err != nil {
		return nil, fmt.Errorf("parameters: approximate: %w", err)
	}
	ag, err := newAgreement(h.MetricsRegisterer(), name)
	if err != nil {
		return nil, err
	}
	fb := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricTokenizeFallbacks,
		Help: "Picks scored from the learned index because the prompt could not be tokenized in time (reason: error, timeout, too_long)."}, []string{"plugin", "reason"})
	c, err := registerShared(h.MetricsRegisterer(), fb)
	if err != nil {
		return nil, err
	}
	ev, err := registerShared(h.MetricsRegisterer(), prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEvictedAfterPick,
		Help: "Of the predicted prompt tokens the servers did not report cached, those whose blocks the servers' KV events removed after the pick: evicted while the request waited, where the index was right when it picked."}, []string{"plugin"}))
	if err != nil {
		return nil, err
	}
	s := &Precise{name: framework.TypedName{Type: PreciseType, Name: name}, key: framework.StateKey(PreciseType + "/" + name),
		approx: a.(*Scorer), hasher: hasher, agreement: ag, fallbacks: c.(*prometheus.CounterVec),
		evictedAfterPick: ev.(*prometheus.CounterVec).WithLabelValues(name),
		maxPrompt:        p.MaxPromptBytes, maxBlocks: DefaultMaxPreciseBlocks, pools: map[framework.PoolKey]map[string]struct{}{}}
	if s.maxPrompt <= 0 {
		s.maxPrompt = DefaultMaxPromptBytes
	}
	s.affinityRules = p.AffinityRules == nil || *p.AffinityRules
	speculative := p.SpeculativeIndexing == nil || *p.SpeculativeIndexing
	if speculative {
		s.speculativeTTL = DefaultSpeculativeTTL
	}
	if p.SpeculativeTTL != "" {
		ttl, err := time.ParseDuration(p.SpeculativeTTL)
		if err != nil {
			return nil, fmt.Errorf("parameters: speculativeTTL: %w", err)
		}
		if ttl <= 0 || ttl > maxSpeculativeTTL {
			return nil, fmt.Errorf("parameters: speculativeTTL %v must be above 0 and at most %v", ttl, maxSpeculativeTTL)
		}
		if speculative {
			s.speculativeTTL = ttl
		}
	}
	backend, timeout, cacheEntries := defaultTokenizerBackend, time.Duration(0), 0
	if t := p.Tokenizer; t != nil {
		if t.Backend != "" {
			backend = t.Backend
		}
		s.renderURL, s.baseModel, cacheEntries = t.URL, t.ModelName, t.CacheEntries
		if t.Timeout != "" {
			if timeout, err = time.ParseDuration(t.Timeout); err != nil {
				return nil, fmt.Errorf("parameters: tokenizer.timeout: %w", err)
			}
		}
	}
	if timeout < 0 || timeout > maxPreciseTokenizerTimer {
		return nil, fmt.Errorf("parameters: tokenizer.timeout %v must be between 0 and %v", timeout, maxPreciseTokenizerTimer)
	}
	topts := tokenize.Options{Timeout: timeout, CacheEntries: cacheEntries}
	switch backend {
	case TokenizerEstimate:
		return s, nil
	case TokenizerRender, TokenizerLocal:
		var pool llmdTokenizerPool
		if pool, err = llmdTokenizers(p.IndexerConfig); err != nil {
			return nil, fmt.Errorf("parameters: indexerConfig.tokenizersPoolConfig: %w", err)
		}
		topts.Local, topts.MinPrefixShare = pool.locals, pool.minPrefixShare
		if s.baseModel == "" {
			s.baseModel = pool.modelName
		}
		if backend == TokenizerLocal && len(topts.Local) == 0 {
			return nil, errors.New("parameters: tokenizer.backend local: indexerConfig.tokenizersPoolConfig.local finds no tokenizer")
		}
		topts.LocalOnly = backend == TokenizerLocal
	default:
		return nil, fmt.Errorf("parameters: tokenizer.backend %q: want %q, %q or %q", backend, TokenizerRender, TokenizerLocal, TokenizerEstimate)
	}
	if s.tokenizer, err = tokenize.New(topts); err != nil {
		return nil, err
	}
	// The event index's blocks come out of the learned index's budget,
	// the process's unless the approximate parameters set one: each pool's
	// share bounds its blocks of both.
	opts := kvevents.Options{Hasher: hasher, MaxBlocksPerEndpoint: p.MaxBlocksPerEndpoint, MaxMessageBytes: p.MaxMessageBytes,
		EventsPerSecond: p.EventsPerSecond, Registerer: h.MetricsRegisterer(), Logger: h.Logger(), SocketPort: DefaultKVEventsPort,
		Budget: eventBudget{s.approx.memory}}
	if k := p.KVEventsConfig; k != nil {
		switch k.EngineType {
		case "", "vllm", "sglang":
		default:
			return nil, fmt.Errorf("parameters: kvEventsConfig.engineType %q: want \"vllm\" or \"sglang\"", k.EngineType)
		}
		opts.ListenEndpoint, opts.TopicFilter = k.ZMQEndpoint, k.TopicFilter
		if k.DiscoverPods != nil && !*k.DiscoverPods {
			opts.SocketPort = 0
		}
		if d := k.PodDiscoveryConfig; d != nil {
			if d.SocketPort != 0 && opts.SocketPort != 0 {
				opts.SocketPort = d.SocketPort
			}
			opts.ReplayPort = d.ReplaySocketPort
		}
	}
	if opts.ListenEndpoint == "" && opts.SocketPort == 0 {
		return nil, fmt.Errorf("parameters: kvEventsConfig: discoverPods is false and no zmqEndpoint is given: no events would arrive")
	}
	if s.events, err = kvevents.NewManager(opts); err != nil {
		return nil, fmt.Errorf("parameters: kvEventsConfig: %w", err)
	}
	if s.approx.peers != nil {
		// With peer sync, the learned index shares the blocks of its picks
		// only on endpoints that it scores, not on those whose events every
		// replica reads (the requests in flight are shared all the same).
		s.approx.peers = unfollowedPeers{Peers: s.approx.peers, s: s}
	}
	// The learned index balances new prefixes by what the events say each
	// server holds, as every replica does.
	s.approx.heldBlocks = s.eventHeldBlocks
	s.start = sync.OnceFunc(func() {
		if err := s.events.Start(h.Context()); err != nil {
			h.Logger().Error(err, "KV events: endpoints are scored from the learned index")
		}
	})
	return s, nil
}

// llmdTokenizerPool is what llmdTokenizers reads.
type llmdTokenizerPool struct {
	locals         map[string]*tokenize.Local
	minPrefixShare float64
	// modelName is the base model (tokenizer.modelName).
	modelName string
}

// llmdTokenizers reads llm-d's tokenizersPoolConfig from indexerConfig:
// its modelName, its minPrefixOverlapRatio (tokenize.Options.MinPrefixShare)
// and its local tokenizers (modelTokenizerMap, and those discovered under
// autoDiscoveryDir, /mnt/models when the local block names none), loaded
// here so that a file that cannot be read fails the config.
func llmdTokenizers(indexerConfig json.RawMessage) (llmdTokenizerPool, error) {
	var none llmdTokenizerPool
	if len(indexerConfig) == 0 {
		return none, nil
	}
	var c struct {
		TokenizersPoolConfig *struct {
			ModelName             string  `json:"modelName"`
			MinPrefixOverlapRatio float64 `json:"minPrefixOverlapRatio"`
			Local                 *struct {
				AutoDiscoveryDir               string            `json:"autoDiscoveryDir"`
				AutoDiscoveryTokenizerFileName string            `json:"autoDiscoveryTokenizerFileName"`
				ModelTokenizerMap              map[string]string `json:"modelTokenizerMap"`
			} `json:"local"`
		} `json:"tokenizersPoolConfig"`
	}
	if err := json.Unmarshal(indexerConfig, &c); err != nil {
		return none, err
	}
	t := c.TokenizersPoolConfig
	if t == nil {
		return none, nil
	}
	if t.MinPrefixOverlapRatio < 0 || t.MinPrefixOverlapRatio > 1 {
		return none, fmt.Errorf("minPrefixOverlapRatio %v must be between 0 and 1", t.MinPrefixOverlapRatio)
	}
	pool := llmdTokenizerPool{minPrefixShare: t.MinPrefixOverlapRatio, modelName: t.ModelName}
	if t.Local == nil {
		return pool, nil
	}
	dir := t.Local.AutoDiscoveryDir
	if dir == "" {
		dir = DefaultLocalTokenizerDir
	}
	paths, err := tokenize.Discover(dir, t.Local.AutoDiscoveryTokenizerFileName)
	if err != nil {
		return none, err
	}
	for model, path := range t.Local.ModelTokenizerMap {
		paths[model] = path
	}
	locals := make(map[string]*tokenize.Local, len(paths))
	for model, path := range paths {
		l, err := tokenize.LoadLocal(path)
		if err != nil {
			return none, fmt.Errorf("local tokenizer of %q: %w", model, err)
		}
		locals[model] = l
	}
	pool.locals = locals
	return pool, nil
}

func registerShared(r prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	if err := r.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if errors.As(err, &dup) {
			return dup.ExistingCollector, nil
		}
		return nil, err
	}
	return c, nil
}

// TypedName is the plugin's type and name in its profile.
func (s *Precise) TypedName() framework.TypedName { return s.name }

// PromptBytes implements framework.PromptReader: the whole prompt, up to
// MaxPromptBytes, for the render endpoint.
func (s *Precise) PromptBytes() int { return max(s.maxPrompt, s.approx.PromptBytes()) }

// preciseCycle is the scorer's state for one request.
type preciseCycle struct {
	// learned are the learned index's scores (with AffinityRules).
	learned []float64
	keys    []uint64
	// matched are each candidate's (by address) leading blocks by its
	// events; absent: scored from the learned index.
	matched      map[string]eventMatch
	promptTokens int
	whole        bool
	// estimatePerToken is the learned index's estimate of tokens over the
	// servers' count of them (the pool's recent scale's inverse): what
	// turns the servers' tokens into the learned index's units when
	// weighing (weigh).
	estimatePerToken float64
}

// eventMatch is a candidate's leading blocks: held by its events, and
// scored by (held or expected to be stored, with speculative indexing).
type eventMatch struct{ held, scored int }

// Score scores from the learned index, then, for the candidates whose
// events are their servers' whole history, from the events.
func (s *Precise) Score(ctx context.Context, cs *framework.CycleState, req *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	s.approx.Score(ctx, cs, req, c, scores)
	st, _ := cs.Reuse(s.key).(*preciseCycle)
	if st == nil {
		st = &preciseCycle{matched: map[string]eventMatch{}}
	}
	if s.affinityRules {
		st.learned = append(st.learned[:0], scores...)
	}
	clear(st.matched)
	st.keys, st.promptTokens = st.keys[:0], 0
	cs.Write(s.key, st)
	if s.events == nil {
		return nil
	}
	eps := make([]*kvevents.Endpoint, len(c))
	render := ""
	for i := range c {
		if ep := s.eventIndex(cs.Pool, c[i].Endpoint); ep != nil && ep.Confirmed() {
			eps[i] = ep
			if render == "" {
				render = "http://" + c[i].Endpoint.Address()
			}
		}
	}
	if render == "" {
		return nil
	}
	if s.renderURL != "" {
		render = s.renderURL
	}
	if len(req.Prompt) >= s.maxPrompt {
		s.fallbacks.WithLabelValues(s.name.Name, "too_long").Inc()
		return nil
	}
	// The base model's tokenizer reads the prompt; the keys are the
	// request's model's (an adapter's blocks are its own).
	tokenizeAs := cs.TargetModel
	if s.baseModel != "" {
		tokenizeAs = s.baseModel
	}
	res, err := s.tokenizer.Tokens(ctx, render, tokenizeAs, req.Prompt)
	tokens := res.IDs
	if err != nil {
		reason := "error"
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		s.fallbacks.WithLabelValues(s.name.Name, reason).Inc()
		return nil
	}
	bs := s.hasher.BlockSize()
	tokens = tokens[:min(len(tokens), s.maxBlocks*bs)]
	st.keys = s.hasher.Keys(st.keys, s.hasher.Root(cs.TargetModel), tokens)
	// Tokens of a learned prefix only (not Whole): the prompt goes on
	// past them, so the server may hold and reuse all their blocks.
	st.promptTokens, st.whole = len(tokens), res.Whole
	st.estimatePerToken = 1 / s.observeTokenScale(cs.Pool, req, res)
	if len(st.keys) == 0 {
		return nil
	}
	total := float64(len(st.keys))
	var now time.Time
	if s.speculativeTTL > 0 {
		now = time.Now()
	}
	for i, ep := range eps {
		if ep == nil {
			continue
		}
		n, ok := ep.Match(st.keys)
		if !ok {
			continue
		}
		m := eventMatch{held: n, scored: n}
		if s.speculativeTTL > 0 {
			if e, ok := ep.MatchExpected(st.keys, now); ok {
				m.scored = max(e, n)
			}
		}
		st.matched[c[i].Endpoint.Address()] = m
		scores[i] = float64(m.scored) / total
	}
	if s.affinityRules {
		s.weigh(cs, req, c, eps, st, scores)
	}
	return nil
}

// weigh rescores the candidates the events scored by the learned index's
// rules (PreciseParams.AffinityRules): their cached tokens against their
// extra load; when no candidate is then worth its cache, the blocks they
// hold or removed recently, weighed alike (with rendezvousNeedsRoom, a
// server with no free sequence passed over while another has one: it
// holds none of the blocks it removed); and when none is worth those
// either, the learned index's scores: where it last sent the prompt's
// prefix, else the rendezvous choice; but when every candidate's events
// are followed and none holds a block of the prompt, the
// rendezvous choice for a prefix held nowhere, whatever the learned index
// believes: its belief is then older than the events, and sent back to a
// server that no longer holds it, the prompt would wait behind that
// server's queue as a miss. So an evicted prefix goes back to
// the server it was on rather than to whichever is least loaded, and the
// servers keep caching each their own prefixes; the removed blocks come
// first because every replica reads the same events, where each sent the
// prefix last differs between replicas. The tokens are weighed in the
// learned index's units (its estimate of them), so that its
// queueCostTokens moves a prefix at the load the approximate scorer moves
// it: counted in the servers' tokens, a prompt of longer words than the
// estimate assumes would give way sooner.
func (s *Precise) weigh(cs *framework.CycleState, req *framework.Request, c []framework.Candidate, eps []*kvevents.Endpoint, st *preciseCycle, scores []float64) {
	var learned *prefixIndex
	var states []*prefixEndpoint
	if s.approx.params.QueueCostTokens > 0 {
		if learned = s.approx.index(cs.Pool); learned != nil {
			states = learned.statesFor(cs.Endpoints)
		}
	}
	cacheMean := s.approx.cacheMean(cs)
	if s.weighMatches(learned, states, cacheMean, c, eps, st, false, scores) {
		return
	}
	if s.weighMatches(learned, states, cacheMean, c, eps, st, true, scores) {
		return
	}
	if s.eventsHoldNone(c, eps, st) {
		clear(scores)
		s.approx.rendezvousHeldNowhere(cs, req, c, scores)
		return
	}
	copy(scores, st.learned)
}

// eventsHoldNone reports whether every candidate's events are followed and
// none of them holds or is expected to store a leading block of the
// prompt (those that removed it were weighed before).
func (s *Precise) eventsHoldNone(c []framework.Candidate, eps []*kvevents.Endpoint, st *preciseCycle) bool {
	for i := range c {
		if eps[i] == nil || st.matched[c[i].Endpoint.Address()].scored > 0 {
			return false
		}
	}
	return true
}

// weighMatches scores the candidates by the leading blocks they hold
// (their matches of Score) or, when removed, hold or removed recently
// (kvevents.Endpoint.MatchRemoved), against their extra load when
// queueCostTokens is set, and reports whether any candidate scores > 0.
// learned and states are the learned index and its states of the pick's
// endpoints, cacheMean the pool's mean cache (prefixCycle).
func (s *Precise) weighMatches(learned *prefixIndex, states []*prefixEndpoint, cacheMean float64, c []framework.Candidate, eps []*kvevents.Endpoint, st *preciseCycle, removed bool, scores []float64) bool {
	a := s.approx
	// A server that removed the prompt's blocks holds none of them: sent
	// there, the prompt is a miss, worth it for the prefix's home but not
	// for a wait behind a full batch (RendezvousNeedsRoom), which a server
	// with a free sequence spares it.
	full := func(int) bool { return false }
	if removed && a.params.RendezvousNeedsRoom && learned != nil {
		full = fullWhileRoom(learned, c, cacheMean, func(int) bool { return true })
	}
	match := func(i int) (int, bool) {
		if eps[i] == nil {
			return 0, false
		}
		if removed {
			if full(i) {
				return 0, true
			}
			return eps[i].MatchRemoved(st.keys)
		}
		m, ok := st.matched[c[i].Endpoint.Address()]
		return m.scored, ok
	}
	switch {
	case a.params.QueueCostTokens > 0:
		bs, units := float64(s.hasher.BlockSize()), st.estimatePerToken
		a.weighAgainstLoad(nil, learned, states, c, cacheMean, float64(st.promptTokens)*units, func(i int) (float64, bool) {
			n, ok := match(i)
			if !ok {
				return 0, false
			}
			if n == 0 {
				// No cache here: nothing to weigh, no score.
				scores[i] = 0
				return 0, false
			}
			return float64(n) * bs * units, true
		}, scores)
	case removed:
		// Unweighed, as Score scores the holders: the share of the
		// prompt's blocks.
		for i := range c {
			if n, ok := match(i); ok && n > 0 {
				scores[i] = float64(n) / float64(len(st.keys))
			}
		}
	}
	return slices.ContainsFunc(scores, func(v float64) bool { return v > 0 })
}

// observeTokenScale tells the learned index the scale of the servers'
// tokens to its estimate, from a whole prompt's tokens, and returns the
// pool's recent scale (1 without an index). The servers' usage reports,
// which tell it in the approximate scorer, go to the events' predictions
// here; without the scale, the learned index would size its LRUs, and
// weigh, in the estimate's tokens (TokenScaledCapacity).
func (s *Precise) observeTokenScale(pool framework.Pool, req *framework.Request, res tokenize.Tokens) float64 {
	x := s.approx.index(pool)
	if x == nil {
		return 1
	}
	if res.Whole && len(res.IDs) > 0 && len(req.Prompt) > 0 {
		estimate := float64(len(req.Prompt)) / float64(s.approx.params.BytesPerToken)
		x.observeTokenScale(min(max(float64(len(res.IDs))/estimate, minTokenScale), maxTokenScale))
	}
	return x.recentTokenScale()
}

// eventHeldBlocks is the blocks e's server holds according to its events,
// with speculative indexing those it is expected to store too, in the
// learned index's blocks (its estimate of their tokens over its tokens a
// block); false when e's events are not followed.
func (s *Precise) eventHeldBlocks(pool framework.Pool, e framework.Endpoint) (int, bool) {
	ep := s.eventIndex(pool, e)
	if ep == nil || !ep.Confirmed() {
		return 0, false
	}
	blocks := ep.Blocks()
	if s.speculativeTTL > 0 {
		blocks += ep.ExpectedBlocks()
	}
	scale := 1.0
	if x := s.approx.index(pool); x != nil {
		scale = x.recentTokenScale()
	}
	a := s.approx.params
	perBlock := float64(a.HashBlockSize) / float64(a.BytesPerToken)
	return int(float64(blocks*s.hasher.BlockSize()) / scale / perBlock), true
}

// PostPick leaves on the Result what the events predicted on the primary
// endpoint, then lets the learned index record the pick.
func (s *Precise) PostPick(ctx context.Context, cs *framework.CycleState, req *framework.Request, res *framework.Result) {
	if v, ok := cs.Read(s.key); ok && len(res.Endpoints) > 0 {
		st := v.(*preciseCycle)
		primary := res.Endpoints[0]
		if m, ok := st.matched[primary.Address()]; ok {
			n := m.held
			bs := s.hasher.BlockSize()
			// The server computes at least the prompt's last token.
			if st.whole {
				n = min(n, (st.promptTokens-1)/bs)
			}
			p := framework.CachePrediction{Observer: s, PredictedTokens: n * bs, PromptTokens: st.promptTokens}
			// The learned index fits what a request ahead costs only when
			// asked to; otherwise the pick pays for neither.
			var learned *prefixIndex
			if s.approx.params.QueueCostFromServers {
				learned = s.approx.index(cs.Pool)
				mean := s.approx.cacheMean(cs)
				p.LoadAtPick, p.QueuedAtPick = loadAtPick(primary, mean, s.approx.batchAtPick(learned, primary, mean))
			}
			ep := s.eventIndex(cs.Pool, primary)
			if ep != nil && s.speculativeTTL > 0 {
				ep.ExpectStored(st.keys, time.Now(), s.speculativeTTL)
			}
			if ep != nil && n > 0 {
				p.Ref, p.Mark = &predictedBlocks{ep: ep, keys: slices.Clone(st.keys[:n]), learned: learned}, uint64(ep.Epoch())
			} else if learned != nil {
				p.Ref = learned
			}
			res.Predict(p)
		}
	}
	s.approx.PostPick(ctx, cs, req, res)
}

// predictedBlocks are the blocks a pick found on its primary endpoint,
// for the server's report to tell those evicted after the pick, and the
// pool's learned index, whose fit of what a request ahead costs the
// report joins.
type predictedBlocks struct {
	ep      *kvevents.Endpoint
	keys    []uint64
	learned *prefixIndex
}

// ObserveCachedTokens counts the server's report against the events'
// prediction, and of what it did not confirm, the blocks the server
// removed after the pick.
func (s *Precise) ObserveCachedTokens(p *framework.CachePrediction, cachedTokens int) {
	if cachedTokens < 0 {
		return
	}
	switch ref := p.Ref.(type) {
	case *predictedBlocks:
		s.approx.observeWait(ref.learned, p, cachedTokens)
	case *prefixIndex:
		s.approx.observeWait(ref, p, cachedTokens)
	}
	s.agreement.observed.Inc()
	s.agreement.predictedTokens.Add(float64(p.PredictedTokens))
	s.agreement.confirmedTokens.Add(float64(min(cachedTokens, p.PredictedTokens)))
	if cachedTokens >= p.PredictedTokens {
		return
	}
	s.agreement.overPredicted.Inc()
	if b, ok := p.Ref.(*predictedBlocks); ok {
		removed := b.ep.RemovedSince(b.keys, uint32(p.Mark)) * s.hasher.BlockSize()
		s.evictedAfterPick.Add(float64(min(removed, p.PredictedTokens-cachedTokens)))
	}
}

// EndpointsChanged implements framework.PoolObserver: an endpoint's
// subscription starts and stops with it.
func (s *Precise) EndpointsChanged(pool framework.Pool, added, removed []framework.Endpoint) {
	s.approx.EndpointsChanged(pool, added, removed)
	if s.events == nil {
		return
	}
	s.start()
	key := pool.Key()
	s.mu.Lock()
	set := s.pools[key]
	if set == nil {
		set = map[string]struct{}{}
		s.pools[key] = set
	}
	for _, e := range removed {
		delete(set, e.Address())
	}
	for _, e := range added {
		set[e.Address()] = struct{}{}
	}
	s.mu.Unlock()
	for _, e := range removed {
		s.events.Remove(key.Namespace, key.Name, e.Address())
	}
	for _, e := range added {
		s.events.Add(key.Namespace, key.Name, e.Address())
	}
}

// PoolRemoved implements framework.PoolObserver: the pool's subscriptions
// stop and its event indexes' blocks are released; another pool's of the
// same servers go on.
func (s *Precise) PoolRemoved(pool framework.Pool) {
	s.approx.PoolRemoved(pool)
	if s.events == nil {
		return
	}
	key := pool.Key()
	s.mu.Lock()
	set := s.pools[key]
	delete(s.pools, key)
	s.mu.Unlock()
	for addr := range set {
		s.events.Remove(key.Namespace, key.Name, addr)
	}
}

// eventIndex is pool's event index of e, nil when it has none.
func (s *Precise) eventIndex(pool framework.Pool, e framework.Endpoint) *kvevents.Endpoint {
	if s.events == nil || pool == nil {
		return nil
	}
	key := pool.Key()
	return s.events.Endpoint(key.Namespace, key.Name, e.Address())
}

// followed tells whether e's blocks are known to pool from its server's
// events: pool's event index of it is confirmed.
func (s *Precise) followed(pool framework.Pool, e framework.Endpoint) bool {
	ep := s.eventIndex(pool, e)
	return ep != nil && ep.Confirmed()
}

// unfollowedPeers are the learned index's peers, told of the blocks of
// endpoints whose events are not followed only: the events tell every
// replica what a followed endpoint holds, better than the peers' picks.
type unfollowedPeers struct {
	framework.Peers
	s *Precise
}

func (p unfollowedPeers) ShareBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if !p.s.followed(pool, e) {
		p.Peers.ShareBlocks(pool, e, blocks)
	}
}

func (p unfollowedPeers) ForgetBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if !p.s.followed(pool, e) {
		p.Peers.ForgetBlocks(pool, e, blocks)
	}
}

// LearnPeerBlocks implements framework.PeerLearner for the learned index,
// of an endpoint whose events are not followed.
func (s *Precise) LearnPeerBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if !s.followed(pool, e) {
		s.approx.LearnPeerBlocks(pool, e, blocks)
	}
}

// ForgetPeerBlocks implements framework.PeerForgetter for the learned
// index, of an endpoint whose events are not followed.
func (s *Precise) ForgetPeerBlocks(pool framework.Pool, e framework.Endpoint, blocks []uint64) {
	if !s.followed(pool, e) {
		s.approx.ForgetPeerBlocks(pool, e, blocks)
	}
}
