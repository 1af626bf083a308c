// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
)

type namedPlugin struct{ name TypedName }

func (p *namedPlugin) TypedName() TypedName { return p.name }

func factoryOf(typ string) Factory {
	return func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
		if err := NoParams(params); err != nil {
			return nil, err
		}
		return &namedPlugin{name: TypedName{Type: typ, Name: name}}, nil
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	for _, typ := range []string{"b-scorer", "a-filter"} {
		if err := r.Register(typ, factoryOf(typ)); err != nil {
			t.Fatalf("Register(%q): %v", typ, err)
		}
	}
	cases := []struct {
		name    string
		typ     string
		factory Factory
		wantErr string
	}{
		{"duplicate", "a-filter", factoryOf("a-filter"), `type "a-filter" is already registered`},
		{"empty name", "", factoryOf(""), "empty type name"},
		{"nil factory", "c-picker", nil, `type "c-picker": nil factory`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := r.Register(c.typ, c.factory)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Register(%q): %v, want an error containing %q", c.typ, err, c.wantErr)
			}
		})
	}
	if got, want := r.Types(), []string{"a-filter", "b-scorer"}; !slices.Equal(got, want) {
		t.Fatalf("Types %v, want %v", got, want)
	}
	f, ok := r.Factory("b-scorer")
	if !ok {
		t.Fatal("registered factory not found")
	}
	p, err := f("mine", nil, NewHandle(t.Context(), logr.Discard(), nil))
	if err != nil || p.TypedName() != (TypedName{Type: "b-scorer", Name: "mine"}) {
		t.Fatalf("factory built %v, %v", p, err)
	}
	if _, ok := r.Factory("c-picker"); ok {
		t.Fatal("a refused registration left a factory")
	}
}

func TestDecodeParams(t *testing.T) {
	type params struct {
		Size int  `json:"size"`
		On   bool `json:"on"`
	}
	cases := []struct {
		raw     string
		want    params
		wantErr string
	}{
		{"", params{Size: 7}, ""},
		{"null", params{Size: 7}, ""},
		{`{"size": 3, "on": true}`, params{Size: 3, On: true}, ""},
		{`{"sise": 3}`, params{}, `unknown field "sise"`},
		{`{"size": "3"}`, params{}, "cannot unmarshal string"},
		{`{"size": 3} {}`, params{}, "trailing data"},
	}
	for _, c := range cases {
		t.Run(c.raw, func(t *testing.T) {
			got := params{Size: 7}
			err := DecodeParams(json.RawMessage(c.raw), &got)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatal(err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, c.wantErr)
			case c.wantErr == "" && got != c.want:
				t.Fatalf("decoded %+v, want %+v", got, c.want)
			}
		})
	}
	if err := NoParams(json.RawMessage(`{"b": 1, "a": 2}`)); err == nil || !strings.Contains(err.Error(), `takes none, got ["a" "b"]`) {
		t.Fatalf("NoParams: %v", err)
	}
	if err := NoParams(json.RawMessage(`{}`)); err != nil {
		t.Fatalf("NoParams({}): %v", err)
	}
}

func TestErrorSentinels(t *testing.T) {
	shed := NewShedError("pool %s saturated", "a")
	none := NewNoEndpointsError("pool %s empty", "a")
	wrapped := fmt.Errorf("scheduling: %w", shed)
	cases := []struct {
		err    error
		target error
		want   bool
	}{
		{shed, ErrShed, true},
		{wrapped, ErrShed, true},
		{none, ErrNoEndpoints, true},
		{shed, ErrNoEndpoints, false},
		{none, ErrShed, false},
		{errors.New("Shed: other"), ErrShed, false},
	}
	for _, c := range cases {
		if got := errors.Is(c.err, c.target); got != c.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", c.err, c.target, got, c.want)
		}
	}
	if shed.Code != 429 || none.Code != 503 || shed.Error() != "Shed: pool a saturated" {
		t.Fatalf("errors %+v %+v", shed, none)
	}
}

type recordingObserver struct {
	got []int
	ref any
}

func (o *recordingObserver) ObserveCachedTokens(p *CachePrediction, cached int) {
	o.got = append(o.got, p.PredictedTokens, cached)
	o.ref = p.Ref
}

func TestResultPrediction(t *testing.T) {
	r := &Result{}
	if r.Prediction().Observer != nil {
		t.Fatal("a prediction before any Predict")
	}
	first, second := &recordingObserver{}, &recordingObserver{}
	ref := &struct{ x int }{}
	if !r.Predict(CachePrediction{Observer: first, Ref: ref, PredictedTokens: 64}) {
		t.Fatal("first prediction refused")
	}
	if r.Predict(CachePrediction{Observer: second, PredictedTokens: 128}) {
		t.Fatal("second prediction kept; the first post-picker's wins")
	}
	if p := r.Prediction(); p.Observer != first || p.Ref != ref || p.PredictedTokens != 64 {
		t.Fatalf("prediction %+v, want the first", p)
	}
}
