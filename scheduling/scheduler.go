// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
)

// Defaults of Options.
const (
	DefaultMaxEndpoints         = 3
	DefaultMetricsStaleness     = 2 * time.Second
	DefaultQueueDepthThreshold  = 5
	DefaultKVCacheUtilThreshold = 0.8
	DefaultSaturationAdmission  = AdmissionPoolAverage
	DefaultDecisionsPerPool     = 8
)

// Rules of Options.SaturationAdmission.
const (
	// AdmissionAllSaturated refuses sheddable requests when every endpoint
	// of the pool is saturated or unknown.
	AdmissionAllSaturated = "all-saturated"
	// AdmissionPoolAverage refuses them when the pool is saturated on
	// average, as the reference endpoint picker's saturation detector does.
	AdmissionPoolAverage = "pool-average"
)

// Options configures a Scheduler. The zero value of every field means its
// documented default; flags are bound to it in cmd/poolpicker.
type Options struct {
	// ConfigFile is the path of an EndpointPickerConfig YAML file, read by
	// New when it is given no Config. Empty: ConfigText, else the default.
	ConfigFile string
	// ConfigText is an EndpointPickerConfig given inline. Empty: ConfigFile,
	// else DefaultConfigText. Setting both is an error.
	ConfigText string

	// MaxEndpoints is the most endpoints a Result holds: the primary, then
	// fallbacks the gateway may retry in order. A picker's maxNumOfEndpoints
	// may lower it. Zero: 3.
	MaxEndpoints int
	// MetricsStaleness is the age past which an endpoint's scrape no longer
	// counts: its load is unknown. Zero: 2s, the scraper's default staleness.
	MetricsStaleness time.Duration
	// QueueDepthThreshold is the number of waiting requests at which an
	// endpoint counts as saturated for admission. Zero: 5.
	QueueDepthThreshold int
	// KVCacheUtilThreshold is the KV-cache use (0..1) at which an endpoint
	// counts as saturated for admission. Zero: 0.8.
	KVCacheUtilThreshold float64
	// SaturationAdmission is the rule by which a pool counts as saturated
	// for refusing sheddable requests (priority < 0): AdmissionAllSaturated,
	// when every endpoint is saturated or unknown, or AdmissionPoolAverage,
	// when the endpoints' mean load (each the larger of waiting requests
	// over QueueDepthThreshold and KV-cache use over KVCacheUtilThreshold,
	// an unknown endpoint counting 1) is at least 1. Empty:
	// DefaultSaturationAdmission.
	SaturationAdmission string
	// EnableConformanceTestFilter restricts candidates to Request.CandidateIPs
	// (the conformance suite's test-epp-endpoint-selection header) in every
	// profile. Never for production: it lets a client choose its endpoint.
	// Zero (false): off, and a config that names the filter is refused.
	EnableConformanceTestFilter bool
	// DecisionsPerPool is how many of each pool's last decisions are kept,
	// with every scorer's score of each candidate, for RecentDecisions (the
	// debug endpoint), each recorded when its Result is committed, off the
	// decision's path. A pool's ring is made at its first pick and dropped
	// with the pool. Zero: 8; negative: none are kept.
	DecisionsPerPool int

	// Rand returns uniformly random uint64s for tie-breaks and weighted
	// picks; it must be safe for concurrent use. Nil: math/rand/v2.
	Rand func() uint64
	// Logger receives the scheduler's logs (keys pool, request). Zero: discard.
	Logger logr.Logger
	// PluginDuration, when set, is asked once per plugin of every profile,
	// when the scheduler is built, for the function that records how long
	// each call of that plugin took; extensionPoint is upstream's name for
	// the call (Filter, Scorer, Picker). Resolving it up front keeps a label
	// lookup off the pick path. Nil: plugins are not timed.
	PluginDuration func(extensionPoint string, plugin TypedName) func(time.Duration)
	// Registry resolves the config's plugin types. Nil: the built-in
	// plugins (NewRegistry).
	Registry *framework.Registry
	// BaseContext returns the context of the plugins' Handle: done when
	// the scheduler's owner stops. Nil: context.Background.
	BaseContext func() context.Context
	// Registerer is where plugins register their metrics
	// (Handle.MetricsRegisterer). Nil: a registry of the scheduler's own,
	// served nowhere.
	Registerer prometheus.Registerer
	// Peers shares what plugins learn from picks with the picker's peer
	// replicas (framework.PeersOf a plugin's Handle); the scheduler's
	// LearnPeerBlocks hands back what the peers learned. Nil: peer sync
	// is off and plugins learn from this replica's picks only.
	Peers framework.Peers
}

// Extension points as upstream's plugin duration metric names them.
const (
	FilterExtensionPoint = "Filter"
	ScorerExtensionPoint = "Scorer"
	PickerExtensionPoint = "Picker"
)

func (o *Options) setDefaults() {
	if o.MaxEndpoints == 0 {
		o.MaxEndpoints = DefaultMaxEndpoints
	}
	if o.MetricsStaleness == 0 {
		o.MetricsStaleness = DefaultMetricsStaleness
	}
	if o.QueueDepthThreshold == 0 {
		o.QueueDepthThreshold = DefaultQueueDepthThreshold
	}
	if o.KVCacheUtilThreshold == 0 {
		o.KVCacheUtilThreshold = DefaultKVCacheUtilThreshold
	}
	if o.SaturationAdmission == "" {
		o.SaturationAdmission = DefaultSaturationAdmission
	}
	if o.DecisionsPerPool == 0 {
		o.DecisionsPerPool = DefaultDecisionsPerPool
	}
	if o.Rand == nil {
		o.Rand = rand.Uint64
	}
}

// Validate reports every option that cannot work, joined: a negative count
// or duration, a KV-cache threshold outside [0, 1], both a config file and a
// config text. Zero is never an error: it means the documented default. New
// calls it; a command calls it first, to refuse bad flags before anything
// is built. The config itself is checked when it is loaded.
func (o Options) Validate() error {
	var errs []error
	if o.ConfigFile != "" && o.ConfigText != "" {
		errs = append(errs, errBothConfigs)
	}
	if o.MaxEndpoints < 0 {
		errs = append(errs, fmt.Errorf("scheduler max endpoints %d: must be at least 1 (0: %d)", o.MaxEndpoints, DefaultMaxEndpoints))
	}
	if o.MetricsStaleness < 0 {
		errs = append(errs, fmt.Errorf("metrics staleness %v: must be positive (0: %v)", o.MetricsStaleness, DefaultMetricsStaleness))
	}
	if o.QueueDepthThreshold < 0 {
		errs = append(errs, fmt.Errorf("saturation queue depth threshold %d: must be at least 1 (0: %d)", o.QueueDepthThreshold, DefaultQueueDepthThreshold))
	}
	if !(o.KVCacheUtilThreshold >= 0 && o.KVCacheUtilThreshold <= 1) {
		errs = append(errs, fmt.Errorf("saturation KV-cache threshold %v: must be in (0, 1] (0: %v)", o.KVCacheUtilThreshold, DefaultKVCacheUtilThreshold))
	}
	switch o.SaturationAdmission {
	case "", AdmissionAllSaturated, AdmissionPoolAverage:
	default:
		errs = append(errs, fmt.Errorf("saturation admission %q: must be %q or %q (empty: %q)", o.SaturationAdmission, AdmissionAllSaturated, AdmissionPoolAverage, DefaultSaturationAdmission))
	}
	return errors.Join(errs...)
}

var errBothConfigs = errors.New("scheduling config: give a config file or a config text, not both")

// registry is Registry or its default.
func (o *Options) registry() *framework.Registry {
	if o.Registry != nil {
		return o.Registry
	}
	return builtinRegistry
}

// handle is the Handle of the plugin instance name of type typ.
func (o *Options) handle(typ, name string) framework.Handle {
	ctx := context.Background()
	if o.BaseContext != nil {
		ctx = o.BaseContext()
	}
	h := framework.NewHandle(ctx, o.Logger.WithName(typ).WithValues("plugin", name), o.Registerer)
	if o.Peers != nil {
		return framework.NewPeerHandle(h, o.Peers)
	}
	return h
}

// LoadConfig returns the config the options name: ConfigFile, ConfigText,
// or the default when neither is set.
func (o *Options) LoadConfig() (*Config, error) {
	switch {
	case o.ConfigFile != "" && o.ConfigText != "":
		return nil, errBothConfigs
	case o.ConfigFile != "":
		return loadConfigFile(o.ConfigFile, o.registry())
	case o.ConfigText != "":
		return loadConfig([]byte(o.ConfigText), o.registry())
	}
	return DefaultConfig(), nil
}

// Scheduler picks endpoints for requests of every served pool. Schedule is
// safe for concurrent use and takes no lock shared between pools; per-pool
// state (the prefix index) lives in the plugins, keyed by pool, and is
// dropped when the pool or its endpoints go. Register the Scheduler with
// the registry (Registry.AddObserver) so it hears of those changes.
type Scheduler struct {
	opts       Options
	built      *builtConfig
	observers  []framework.PoolObserver
	learners   []framework.PeerLearner
	forgetters []framework.PeerForgetter
	states     sync.Pool // *cycle
	// pools holds per-pool scheduler state (*poolState) keyed by *Pool, so a
	// pool removed and added again starts afresh.
	pools sync.Map
}

type poolState struct {
	// warnedProfile is the last unknown profile name logged for the pool, so
	// a bad annotation is logged once, not per request.
	warnedProfile atomic.Pointer[string]
	// decisions holds the pool's last decisions; nil until its first pick
	// (or when Options.DecisionsPerPool is negative).
	decisions atomic.Pointer[decisionRing]
}

var _ datastore.Observer = (*Scheduler)(nil)

// New builds a Scheduler from cfg (nil: the config opts names, see
// Options.LoadConfig), with its own plugin instances.
func New(cfg *Config, opts Options) (*Scheduler, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if cfg == nil {
		var err error
		if cfg, err = opts.LoadConfig(); err != nil {
			return nil, err
		}
	}
	built, err := buildProfiles(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("scheduling config: %w", err)
	}
	s := &Scheduler{opts: opts, built: built}
	for _, p := range built.plugins {
		if o, ok := p.(framework.PoolObserver); ok {
			s.observers = append(s.observers, o)
		}
		if l, ok := p.(framework.PeerLearner); ok && opts.Peers != nil {
			s.learners = append(s.learners, l)
		}
		if f, ok := p.(framework.PeerForgetter); ok && opts.Peers != nil {
			s.forgetters = append(s.forgetters, f)
		}
	}
	s.states.New = func() any { return &cycle{} }
	opts.Logger.V(1).Info("scheduler configured", "profiles", cfg.ProfileNames(), "defaultProfile", built.defaultProfile,
		"maxEndpoints", opts.MaxEndpoints, "metricsStaleness", opts.MetricsStaleness)
	return s, nil
}

// PromptBytes is how many leading bytes of Request.Prompt the configured
// plugins read at most (the largest framework.PromptReader.PromptBytes);
// zero when none reads it. The prefix-cache scorer hashes at most
// maxPrefixBlocksToMatch blocks of hashBlockSize bytes, so a caller may cut
// a longer prompt to this length (and only skim the rest of the body, as
// requestbody does) without changing any decision.
func (s *Scheduler) PromptBytes() int {
	n := 0
	for _, p := range s.built.plugins {
		if r, ok := p.(framework.PromptReader); ok {
			n = max(n, r.PromptBytes())
		}
	}
	return n
}

// DefaultProfile names the profile of pools that name none.
func (s *Scheduler) DefaultProfile() string { return s.built.defaultProfile }

// ScheduleDeferred picks the endpoints for req in pool: the primary, then
// up to MaxEndpoints-1 fallbacks, in order, or a 503 Error when no
// endpoint is eligible. Endpoints whose load is unknown come after every
// endpoint whose load is known. It filters, scores and picks only: the
// caller has applied the pool's model rewrite (Request.TargetModel) and
// decided whether to shed the request (AdmissionSaturated), and adds and
// removes the request's in-flight count.
//
// The post-pick step, where plugins learn from the pick (the prefix-cache
// scorer records the prompt's blocks for the primary endpoint), is left to
// the caller, who runs it with Result.Commit once the decision is on its
// way, so that work is off the request's latency path. req, with its
// Prompt, must stay unchanged until then. A Result never committed only
// loses what the plugins would have learned.
func (s *Scheduler) ScheduleDeferred(ctx context.Context, pool *datastore.Pool, req *Request) (*Result, error) {
	if pool == nil {
		return nil, NewNoEndpointsError("no pool given")
	}
	if req == nil {
		req = &Request{}
	}
	eps := pool.Endpoints()
	if eps.Len() == 0 {
		return nil, NewNoEndpointsError("pool %s has no ready endpoints", pool.Key)
	}

	cy := s.states.Get().(*cycle)
	cs := &cy.CycleState
	cs.Begin(dsview.Pool(pool), s.saturation(), s.opts.Rand)
	cy.candidates, cy.picked, cy.statuses = cy.candidates[:0], cy.picked[:0], cy.statuses[:0]
	committing := false
	defer func() {
		if !committing {
			s.recycle(cy)
		}
	}()

	cs.TargetModel = req.TargetModel
	if cs.TargetModel == "" {
		cs.TargetModel = req.Model
	}
	cs.Priority, _ = pool.Policy().Priority(req.Objective)

	now := time.Now()
	cs.Endpoints = dsview.EndpointSet(eps)
	for i, e := range eps.Endpoints {
		m := e.Metrics()
		if !m.Fresh(now, s.opts.MetricsStaleness) {
			m = nil
		}
		// Filled in place: appending a literal has the compiler build it
		// on the stack and copy it, on every endpoint of every pick.
		cy.candidates = append(cy.candidates, framework.Candidate{})
		c := &cy.candidates[len(cy.candidates)-1]
		c.Endpoint, c.Metrics, c.Index, c.Held = dsview.Endpoint(e), dsview.Metrics(m), i, e.HeldAtOrAbove(cs.Priority)
	}

	prof := s.profileFor(pool)
	record := s.opts.DecisionsPerPool > 0
	cands := cy.candidates
	for i, f := range prof.filters {
		start := prof.timers.start()
		before := len(cands)
		var st *framework.Status
		cands, st = f.Filter(ctx, cs, req, cands)
		prof.timers.observe(prof.timers.filters, i, start)
		if !st.IsSuccess() {
			cy.statuses = append(cy.statuses, pluginStatus{plugin: f.TypedName(), point: FilterExtensionPoint, status: st, dropped: before - len(cands)})
		}
		var err *Error
		switch {
		case st.Code() == framework.Failed:
			err = NewNoEndpointsError("pool %s: filter %q failed: %s", pool.Key, f.TypedName().Name, st.Message())
		case len(cands) == 0:
			err = NewNoEndpointsError("pool %s: filter %q left no endpoint (of %d) for the request%s", pool.Key, f.TypedName().Name, len(eps.Endpoints), reasonsOf(st))
		}
		if err != nil {
			if record {
				s.decisionRing(pool).record(now, req, cs.TargetModel, prof, nil, nil, nil, nil, cy.statuses, err.Message)
			}
			return nil, err
		}
	}
	known := partitionKnown(cands)

	totals := grow(&cy.totals, len(cands))
	scores := grow(&cy.scores, len(cands))
	var perScorer []float64
	if record {
		perScorer = grow(&cy.perScorer, len(prof.scorers)*len(cands))
	}
	clear(totals)
	for i, ws := range prof.scorers {
		clear(scores)
		start := prof.timers.start()
		st := ws.Score(ctx, cs, req, cands, scores)
		prof.timers.observe(prof.timers.scorers, i, start)
		if !st.IsSuccess() {
			// A scorer that could not score ranks no one.
			cy.statuses = append(cy.statuses, pluginStatus{plugin: ws.TypedName(), point: ScorerExtensionPoint, status: st})
			clear(scores)
		}
		for j, v := range scores {
			v = clamp01(v)
			totals[j] += ws.weight * v
			if record {
				perScorer[i*len(cands)+j] = v
			}
		}
	}

	n := s.opts.MaxEndpoints
	if prof.pickerMax > 0 && prof.pickerMax < n {
		n = prof.pickerMax
	}
	n = min(n, len(cands))
	picked := cy.picked[:0]
	start := prof.timers.start()
	if known > 0 {
		picked = prof.picker.Pick(ctx, cs, req, cands[:known], totals[:known], min(n, known), picked)
	}
	if len(picked) < n && known < len(cands) {
		// Unknown endpoints only after every known one: a fresh pool still
		// serves, but an unscraped pod never outranks a measured one.
		from := len(picked)
		picked = prof.picker.Pick(ctx, cs, req, cands[known:], totals[known:], n-len(picked), picked)
		for i := from; i < len(picked); i++ {
			picked[i] += known
		}
	}
	prof.timers.observe(prof.timers.picker, 0, start)
	cy.picked = picked
	if len(picked) == 0 {
		return nil, NewNoEndpointsError("pool %s: picker %q chose no endpoint", pool.Key, prof.picker.TypedName().Name)
	}

	box := newResult(len(picked))
	res := &box.res
	for _, i := range picked {
		// By the candidate's position in the snapshot, not its view: the
		// caller gets the endpoint itself, which plugins never hold.
		idx := cands[i].Index
		if idx < 0 || idx >= len(eps.Endpoints) {
			return nil, NewNoEndpointsError("pool %s: a plugin of profile %q left a candidate with index %d of %d endpoints", pool.Key, prof.name, idx, len(eps.Endpoints))
		}
		res.Endpoints = append(res.Endpoints, eps.Endpoints[idx])
	}
	res.Profile = prof.name
	res.Priority = cs.Priority
	if len(cy.statuses) > 0 {
		res.Statuses = make([]PluginStatus, len(cy.statuses))
		for i := range cy.statuses {
			res.Statuses[i] = cy.statuses[i].export()
		}
	}
	if req.Scores {
		res.Scores = make(map[string]float64, len(cands))
		for i := range cands {
			res.Scores[cands[i].Endpoint.Address()] = totals[i]
		}
	}
	if len(prof.postPickers) > 0 || record {
		box.commit = pendingCommit{s: s, cy: cy}
		cy.ctx, cy.req, cy.postPickers = ctx, req, prof.postPickers
		if record {
			// Recorded at commit, once the decision is on its way: the
			// cycle's buffers stay the scheduler's until then.
			cy.decision = pendingDecision{pool: pool, at: now, prof: prof, cands: cands, totals: totals, perScorer: perScorer, picked: picked, statuses: cy.statuses}
		}
		res.pending = &box.commit
		committing = true
	}
	if l := s.opts.Logger.V(4); l.Enabled() {
		l.Info("scheduled", "pool", pool.Key.String(), "request", req.ID, "profile", prof.name,
			"endpoint", res.Endpoints[0].Address, "fallbacks", len(res.Endpoints)-1, "targetModel", cs.TargetModel)
	}
	return res, nil
}

// cycle is a scheduling cycle's state, recycled between Schedule calls:
// the plugins' CycleState and the scheduler's own buffers.
type cycle struct {
	framework.CycleState

	candidates []framework.Candidate
	scores     []float64
	totals     []float64
	// perScorer holds each scorer's scores of the candidates, scorer-major,
	// for the decision record.
	perScorer []float64
	picked    []int
	// statuses are what the filters and scorers said when it was not a
	// plain success, in the order they ran.
	statuses []pluginStatus
	// ctx, req and postPickers are the pick's, for its commit.
	ctx         context.Context
	req         *Request
	postPickers []framework.PostPicker
	// decision is the pick the commit records.
	decision pendingDecision
	// seen is the result as the post-pick plugins see it (views), built
	// at commit.
	seen framework.Result
}

func (s *Scheduler) recycle(cy *cycle) {
	cy.End()
	cy.decision = pendingDecision{}
	cy.ctx, cy.req, cy.postPickers = nil, nil, nil
	clear(cy.candidates[:cap(cy.candidates)])
	clear(cy.statuses[:cap(cy.statuses)])
	clear(cy.seen.Endpoints[:cap(cy.seen.Endpoints)])
	cy.seen = framework.Result{Endpoints: cy.seen.Endpoints[:0]}
	s.states.Put(cy)
}

// pendingCommit is the post-pick step of a ScheduleDeferred, run by
// Result.Commit; what it needs of the pick waits in the cycle, so that
// the Result, allocated per pick, stays small.
type pendingCommit struct {
	s  *Scheduler
	cy *cycle
}

// pendingDecision is a pick to record at commit, over the cycle's buffers;
// its pool is nil when decisions are not kept.
type pendingDecision struct {
	pool      *datastore.Pool
	at        time.Time
	prof      *profile
	cands     []framework.Candidate
	totals    []float64
	perScorer []float64
	picked    []int
	statuses  []pluginStatus
}

// commit runs the post-pick plugins on r's view, then recycles the
// cycle's state.
func (p *pendingCommit) commit(r *Result) {
	// The views live in the recycled cycle, so they cost the pick no
	// allocation; only the prediction outlives the commit.
	cy := p.cy
	if len(cy.postPickers) > 0 {
		seen := &cy.seen
		seen.Endpoints = seen.Endpoints[:0]
		for _, e := range r.Endpoints {
			seen.Endpoints = append(seen.Endpoints, dsview.Endpoint(e))
		}
		seen.TargetModel, seen.ModelRewrite, seen.Profile, seen.Priority = cy.TargetModel, cy.req.ModelRewrite, r.Profile, r.Priority
		for _, pp := range cy.postPickers {
			pp.PostPick(cy.ctx, &cy.CycleState, cy.req, seen)
		}
		r.prediction = seen.Prediction()
	}
	if d := &cy.decision; d.pool != nil {
		p.s.decisionRing(d.pool).record(d.at, cy.req, cy.TargetModel, d.prof, d.cands, d.totals, d.perScorer, d.picked, d.statuses, "")
	}
	p.s.recycle(cy)
	// The Result outlives the commit (it hears the server's cached tokens
	// later): it must not pin the request.
	*p = pendingCommit{}
}

// resultBox allocates a Result, room for its endpoints and its pending
// commit at once.
type resultBox struct {
	res    Result
	buf    [resultRoom]*datastore.Endpoint
	commit pendingCommit
}

// resultRoom is the endpoints a Result holds without another allocation.
const resultRoom = DefaultMaxEndpoints + 1

func newResult(n int) *resultBox {
	b := &resultBox{}
	if n <= len(b.buf) {
		b.res.Endpoints = b.buf[:0:n]
	} else {
		b.res.Endpoints = make([]*datastore.Endpoint, 0, n)
	}
	return b
}

// profileFor reads the pool's annotation on every call, so a change of
// profile applies to the next request.
func (s *Scheduler) profileFor(pool *datastore.Pool) *profile {
	var name string
	if spec := pool.Spec(); spec != nil {
		name = spec.Annotations[ProfileAnnotation]
	}
	if name != "" {
		if p, ok := s.built.profiles[name]; ok {
			return p
		}
		st := s.poolState(pool)
		if w := st.warnedProfile.Load(); w == nil || *w != name {
			warned := name // a copy, so name itself stays on the stack
			st.warnedProfile.Store(&warned)
			s.opts.Logger.Error(nil, "pool names an unknown scheduling profile; using the default", "pool", pool.Key.String(),
				"annotation", ProfileAnnotation, "profile", name, "default", s.built.defaultProfile)
		}
	}
	return s.built.profiles[s.built.defaultProfile]
}

func (s *Scheduler) poolState(pool *datastore.Pool) *poolState {
	if v, ok := s.pools.Load(pool); ok {
		return v.(*poolState)
	}
	v, loaded := s.pools.LoadOrStore(pool, &poolState{})
	if !loaded && pool.Removed() {
		// PoolRemoved may have run before the store; do not keep state for
		// a pool that is gone.
		s.pools.Delete(pool)
	}
	return v.(*poolState)
}

// EndpointsChanged implements datastore.Observer: plugins drop what they
// keep for endpoints that left.
func (s *Scheduler) EndpointsChanged(pool *datastore.Pool, added, removed []*datastore.Endpoint) {
	if len(s.observers) == 0 {
		return
	}
	p, a, r := dsview.Pool(pool), dsview.Endpoints(added), dsview.Endpoints(removed)
	for _, o := range s.observers {
		o.EndpointsChanged(p, a, r)
	}
}

// LearnPeerBlocks hands a peer replica's pick (endpoint e of pool now
// caches blocks, see framework.PeerLearner) to the plugins that learn from
// peers; a no-op without Options.Peers.
func (s *Scheduler) LearnPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if len(s.learners) == 0 || pool == nil || e == nil {
		return
	}
	p, ep := dsview.Pool(pool), dsview.Endpoint(e)
	for _, l := range s.learners {
		l.LearnPeerBlocks(p, ep, blocks)
	}
}

// ForgetPeerBlocks hands a peer replica's news that endpoint e of pool no
// longer caches blocks (see framework.PeerForgetter) to the plugins that
// learn it; a no-op without Options.Peers.
func (s *Scheduler) ForgetPeerBlocks(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
	if len(s.forgetters) == 0 || pool == nil || e == nil {
		return
	}
	p, ep := dsview.Pool(pool), dsview.Endpoint(e)
	for _, f := range s.forgetters {
		f.ForgetPeerBlocks(p, ep, blocks)
	}
}

// PoolRemoved implements datastore.Observer: the pool's state is dropped.
func (s *Scheduler) PoolRemoved(pool *datastore.Pool) {
	s.pools.Delete(pool)
	for _, o := range s.observers {
		o.PoolRemoved(dsview.Pool(pool))
	}
}

// partitionKnown moves candidates with known load before the others,
// keeping each group's order, and returns how many are known.
func partitionKnown(c []framework.Candidate) int {
	k := 0
	for i := range c {
		if !c[i].Metrics.IsZero() {
			if i != k {
				// Rotate the unknown run right by one; runs are short in
				// practice (unknown endpoints are rare).
				x := c[i]
				copy(c[k+1:i+1], c[k:i])
				c[k] = x
			}
			k++
		}
	}
	return k
}

func grow(buf *[]float64, n int) []float64 {
	if cap(*buf) < n {
		*buf = make([]float64, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

func clamp01(v float64) float64 {
	switch {
	case v > 1:
		return 1
	case v >= 0:
		return v
	}
	return 0 // negative or NaN
}
