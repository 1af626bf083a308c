// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package debugview serves, as JSON, what the picker knows of each pool it
// serves: its endpoints with their metrics' age, in-flight requests and
// queue, and its last decisions with each scorer's scores. It reads the
// registry's and the scheduler's snapshots and never blocks a pick.
package debugview

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
)

// Path is where the metrics server serves the view.
const Path = "/debug/pools"

// Options configure a Handler. The zero value of every field means its
// documented default.
type Options struct {
	// Registry holds the served pools. Required.
	Registry *datastore.Registry
	// Decisions returns a pool's last decisions, newest first
	// (scheduling.Scheduler.RecentDecisions). Nil: none are listed.
	Decisions func(*datastore.Pool) []scheduling.Decision
	// Now is the clock metric ages are measured by. Nil: time.Now.
	Now func() time.Time
}

// View is the document the handler writes.
type View struct {
	// Pools are the served pools (all, or those the query selects), by
	// namespace and name.
	Pools []Pool `json:"pools"`
}

// Pool is one served pool.
type Pool struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// PickerService is the endpointPickerRef Service and port gateways
	// address the pool's picker by.
	PickerService string `json:"pickerService,omitempty"`
	// Synced tells whether the pool's pods have been listed; SyncError why
	// they cannot be, while they cannot.
	Synced    bool   `json:"synced"`
	SyncError string `json:"syncError,omitempty"`
	// Requests counts the pool's requests since it was served;
	// LastRequest is when the last one arrived (to 100 ms).
	Requests    uint64     `json:"requests"`
	LastRequest *time.Time `json:"lastRequest,omitempty"`
	Endpoints   []Endpoint `json:"endpoints"`
	// Decisions are the last picks, newest first.
	Decisions []scheduling.Decision `json:"decisions"`
}

// Endpoint is one of a pool's endpoints.
type Endpoint struct {
	Address string `json:"address"`
	Pod     string `json:"pod"`
	// InFlight counts requests sent to it and not yet finished, this
	// replica's and its peers'; OwnInFlight this replica's alone.
	InFlight    int64 `json:"inFlight"`
	OwnInFlight int64 `json:"ownInFlight"`
	// Metrics is its last scrape; nil when it has never been scraped.
	Metrics *Metrics `json:"metrics"`
}

// Metrics is an endpoint's last scrape.
type Metrics struct {
	// AgeSeconds is the time since the scrape finished.
	AgeSeconds float64 `json:"ageSeconds"`
	// Waiting is the server's queue, Running what it is decoding.
	Waiting      int     `json:"waiting"`
	Running      int     `json:"running"`
	KVCacheUsage float64 `json:"kvCacheUsage"`
}

// Handler serves the view on GET: every pool, or with ?namespace= and
// ?pool= (a name) only those.
func Handler(o Options) http.Handler {
	if o.Now == nil {
		o.Now = time.Now
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, fmt.Sprintf("%s %s: only GET", r.Method, Path), http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		v := Build(o, q.Get("namespace"), q.Get("pool"))
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v) // a client gone mid-write has nothing to learn
	})
}

// Build makes the view of the pools in namespace named name (empty: any).
func Build(o Options, namespace, name string) View {
	now := o.Now()
	v := View{Pools: []Pool{}}
	for _, p := range o.Registry.Pools() {
		if (namespace != "" && p.Key.Namespace != namespace) || (name != "" && p.Key.Name != name) {
			continue
		}
		vp := Pool{Namespace: p.Key.Namespace, Name: p.Key.Name, Synced: p.Synced(), SyncError: p.SyncError(),
			Requests: p.Requests(), Endpoints: []Endpoint{}, Decisions: []scheduling.Decision{}}
		if spec := p.Spec(); spec != nil && spec.PickerService != "" {
			vp.PickerService = fmt.Sprintf("%s:%d", spec.PickerService, spec.PickerPort)
		}
		if t := p.LastRequest(); !t.IsZero() {
			vp.LastRequest = &t
		}
		for _, e := range p.Endpoints().Endpoints {
			ve := Endpoint{Address: e.Address, Pod: e.Pod.String(), InFlight: e.InFlight(), OwnInFlight: e.OwnInFlight()}
			if m := e.Metrics(); m != nil {
				ve.Metrics = &Metrics{AgeSeconds: now.Sub(m.ScrapedAt).Seconds(), Waiting: m.WaitingRequests, Running: m.RunningRequests, KVCacheUsage: m.KVCacheUsage}
			}
			vp.Endpoints = append(vp.Endpoints, ve)
		}
		if o.Decisions != nil {
			vp.Decisions = append(vp.Decisions, o.Decisions(p)...)
		}
		v.Pools = append(v.Pools, vp)
	}
	return v
}
