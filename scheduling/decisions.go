// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"slices"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// maxRecordedCandidates bounds the candidates a recorded decision keeps:
// the picked ones, then the highest totals of the rest. A decision's memory
// and the cost of recording it stay bounded however large the pool.
const maxRecordedCandidates = 8

// Decision is one recent pick of a pool with what each scorer gave every
// candidate, as the debug endpoint shows it.
type Decision struct {
	// At is when the pick was made.
	At time.Time `json:"at"`
	// Request is the request's x-request-id.
	Request string `json:"request"`
	// Profile names the scheduling profile that ran.
	Profile string `json:"profile"`
	// TargetModel is the model after the pool's rewrite rules.
	TargetModel string `json:"targetModel"`
	// Picked are the endpoints of the result (ip:port), primary first.
	Picked []string `json:"picked"`
	// Scorers name the profile's scorers (type/name) in the order of each
	// candidate's Scores, with their weights.
	Scorers []string  `json:"scorers"`
	Weights []float64 `json:"weights"`
	// Candidates are the endpoints scored: the picked ones first, then the
	// highest totals of the rest, at most 8 (the picked ones alone when
	// the profile has no scorer).
	Candidates []ScoredCandidate `json:"candidates"`
	// Statuses are what filters and scorers said when it was not a plain
	// success (Result.Statuses).
	Statuses []PluginStatus `json:"statuses,omitempty"`
	// Error is why the request was refused when a filter left no endpoint
	// or failed; Picked and Candidates are then empty.
	Error string `json:"error,omitempty"`
}

// ScoredCandidate is one endpoint's scores in a Decision.
type ScoredCandidate struct {
	Address string `json:"address"`
	// Scores are each scorer's score (0..1), in Decision.Scorers' order.
	Scores []float64 `json:"scores"`
	// Total is the weighted sum the picker ranked by.
	Total float64 `json:"total"`
}

// decisionRing keeps a pool's last decisions in slots whose buffers are
// reused, so that recording allocates nothing once the slots have grown to
// the pool's size. A pick is recorded at its commit (Result.Commit), after
// the decision has been sent, with TryLock: when a concurrent commit or a
// reader holds the ring, the record is skipped, so a commit never waits.
type decisionRing struct {
	mu    sync.Mutex
	slots []decisionSlot
	// next is the slot the next record overwrites; filled counts the
	// slots written so far (up to len(slots)).
	next, filled int
}

// decisionSlot is a recorded decision in reusable buffers. scores holds
// len(addrs) rows of len(prof.scorers) scores.
type decisionSlot struct {
	at          time.Time
	request     string
	targetModel string
	prof        *profile
	picked      int // the first picked addresses are the result's
	addrs       []string
	totals      []float64
	scores      []float64
	// taken marks the cycle's candidates already copied; best holds the
	// positions of the highest totals among the rest, highest first.
	taken []bool
	best  []int
	// statuses are the cycle's plugin statuses; err the refusal's message.
	statuses []pluginStatus
	err      string
}

// record copies a decision into the oldest slot. cands and totals are the
// cycle's candidates and weighted totals, perScorer their scores by scorer
// (scorer-major), picked the result's candidate positions, statuses the
// plugins' statuses; err is the refusal's message of a request refused
// (then there are no candidates).
func (r *decisionRing) record(at time.Time, req *Request, targetModel string, prof *profile, cands []framework.Candidate, totals, perScorer []float64, picked []int, statuses []pluginStatus, err string) {
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	s := &r.slots[r.next]
	r.next = (r.next + 1) % len(r.slots)
	r.filled = min(r.filled+1, len(r.slots))
	s.at, s.request, s.targetModel, s.prof, s.picked, s.err = at, req.ID, targetModel, prof, len(picked), err
	s.statuses = append(s.statuses[:0], statuses...)
	s.addrs, s.totals, s.scores = s.addrs[:0], s.totals[:0], s.scores[:0]
	// The rest by highest total in one pass, keeping the best few in
	// order by insertion, without sorting the cycle's buffers. Without
	// scorers every total is zero: there is no best to show, nor a need
	// to mark what was picked.
	room := max(maxRecordedCandidates-len(picked), 0)
	if len(prof.scorers) == 0 {
		room = 0
	}
	if room > 0 {
		s.taken = slices.Grow(s.taken[:0], len(cands))[:len(cands)]
		clear(s.taken)
	}
	add := func(i int) {
		if room > 0 {
			s.taken[i] = true
		}
		s.addrs = append(s.addrs, cands[i].Endpoint.Address())
		s.totals = append(s.totals, totals[i])
		for j := range prof.scorers {
			s.scores = append(s.scores, perScorer[j*len(cands)+i])
		}
	}
	for _, i := range picked {
		add(i)
	}
	s.best = s.best[:0]
	for i := 0; room > 0 && i < len(cands); i++ {
		if s.taken[i] || (len(s.best) == room && totals[i] <= totals[s.best[room-1]]) {
			continue
		}
		if len(s.best) < room {
			s.best = append(s.best, i)
		} else {
			s.best[room-1] = i
		}
		for k := len(s.best) - 1; k > 0 && totals[s.best[k]] > totals[s.best[k-1]]; k-- {
			s.best[k], s.best[k-1] = s.best[k-1], s.best[k]
		}
	}
	for _, i := range s.best {
		add(i)
	}
}

// decisions copies the recorded decisions out, newest first.
func (r *decisionRing) decisions() []Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Decision, 0, r.filled)
	for k := 1; k <= r.filled; k++ {
		s := &r.slots[(r.next-k+len(r.slots))%len(r.slots)]
		d := Decision{At: s.at, Request: s.request, Profile: s.prof.name, TargetModel: s.targetModel,
			Picked: slices.Clone(s.addrs[:s.picked]), Error: s.err}
		for i := range s.statuses {
			d.Statuses = append(d.Statuses, s.statuses[i].export())
		}
		for _, ws := range s.prof.scorers {
			d.Scorers = append(d.Scorers, ws.TypedName().String())
			d.Weights = append(d.Weights, ws.weight)
		}
		n := len(s.prof.scorers)
		for i, a := range s.addrs {
			d.Candidates = append(d.Candidates, ScoredCandidate{Address: a, Total: s.totals[i], Scores: slices.Clone(s.scores[i*n : (i+1)*n])})
		}
		out = append(out, d)
	}
	return out
}

// RecentDecisions returns the pool's last decisions (at most
// Options.DecisionsPerPool), newest first; none when recording is off or
// the pool has had no pick. Safe for concurrent use with picks.
func (s *Scheduler) RecentDecisions(pool *datastore.Pool) []Decision {
	v, ok := s.pools.Load(pool)
	if !ok {
		return nil
	}
	ring := v.(*poolState).decisions.Load()
	if ring == nil {
		return nil
	}
	return ring.decisions()
}

// decisionRing returns the pool's ring, made at its first pick.
func (s *Scheduler) decisionRing(pool *datastore.Pool) *decisionRing {
	st := s.poolState(pool)
	if r := st.decisions.Load(); r != nil {
		return r
	}
	st.decisions.CompareAndSwap(nil, &decisionRing{slots: make([]decisionSlot, s.opts.DecisionsPerPool)})
	return st.decisions.Load()
}
