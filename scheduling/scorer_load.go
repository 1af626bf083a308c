package scheduling

import (
	"context"
	"encoding/json"
)

// The load scorers rank candidates by one load signal, lower being better.
// Count signals are normalised over the candidates, (max-v)/(max-min), so
// the least loaded scores 1, the most loaded 0, and equal loads all score 1;
// endpoints with unknown load score 0 and do not enter the min and max.

// queueScorer ranks by requests waiting in the model server's queue.
type queueScorer struct{ name TypedName }

func newQueueScorer(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &queueScorer{name: TypedName{Type: QueueScorerType, Name: name}}, nil
}

func (s *queueScorer) TypedName() TypedName { return s.name }

func (s *queueScorer) Score(_ context.Context, _ *CycleState, _ *Request, c []Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; m != nil {
			scores[i] = float64(m.WaitingRequests)
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
}

// runningRequestsScorer ranks by requests the model server is decoding.
type runningRequestsScorer struct{ name TypedName }

func newRunningRequestsScorer(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &runningRequestsScorer{name: TypedName{Type: RunningRequestsScorerType, Name: name}}, nil
}

func (s *runningRequestsScorer) TypedName() TypedName { return s.name }

func (s *runningRequestsScorer) Score(_ context.Context, _ *CycleState, _ *Request, c []Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; m != nil {
			scores[i] = float64(m.RunningRequests)
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
}

// inFlightScorer ranks by the requests poolpicker itself sent to the
// endpoint and has not seen finish. Unlike scraped metrics it is exact and
// current, so it spreads a burst that arrives between two scrapes; it is
// known for every endpoint, scraped or not.
type inFlightScorer struct{ name TypedName }

func newInFlightScorer(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &inFlightScorer{name: TypedName{Type: InFlightScorerType, Name: name}}, nil
}

func (s *inFlightScorer) TypedName() TypedName { return s.name }

func (s *inFlightScorer) Score(_ context.Context, _ *CycleState, _ *Request, c []Candidate, scores []float64) {
	for i := range c {
		// Read once: the count moves while we score.
		scores[i] = float64(max(c[i].Endpoint.InFlight(), 0))
	}
	normaliseLowerBetter(scores)
}

// kvCacheScorer scores 1 - KV-cache use: the fraction of the server's KV
// cache still free, an absolute measure (not normalised over candidates).
type kvCacheScorer struct{ name TypedName }

func newKVCacheScorer(name string, params json.RawMessage) (Plugin, error) {
	if err := noParams(params); err != nil {
		return nil, err
	}
	return &kvCacheScorer{name: TypedName{Type: KVCacheUtilizationScorerType, Name: name}}, nil
}

func (s *kvCacheScorer) TypedName() TypedName { return s.name }

func (s *kvCacheScorer) Score(_ context.Context, _ *CycleState, _ *Request, c []Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; m != nil {
			scores[i] = 1 - m.KVCacheUsage
		}
	}
}

// unknownLoad marks a candidate without a load value in normaliseLowerBetter.
const unknownLoad = -1

// normaliseLowerBetter maps load values (>= 0, or unknownLoad) in place to
// (max-v)/(max-min); all equal → 1; unknown → 0.
func normaliseLowerBetter(v []float64) {
	lo, hi := 0.0, -1.0
	for _, x := range v {
		if x < 0 {
			continue
		}
		if hi < 0 {
			lo, hi = x, x
			continue
		}
		lo, hi = min(lo, x), max(hi, x)
	}
	for i, x := range v {
		switch {
		case x < 0:
			v[i] = 0
		case hi == lo:
			v[i] = 1
		default:
			v[i] = (hi - x) / (hi - lo)
		}
	}
}
