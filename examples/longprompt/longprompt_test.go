// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package longprompt_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"example.com/longprompt"

	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/framework/frameworktest"
)

func TestFactory(t *testing.T) {
	cases := []struct {
		name, params string
		want         int // PromptBytes
		wantErr      string
	}{
		{"defaults", "", longprompt.DefaultMinPromptBytes, ""},
		{"threshold", `{"minPromptBytes": 100, "label": "gpu/long"}`, 100, ""},
		{"negative threshold", `{"minPromptBytes": -1}`, 0, "minPromptBytes -1 must be at least 1"},
		{"unknown parameter", `{"minPromptByte": 100}`, 0, `unknown field "minPromptByte"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := longprompt.New("x", json.RawMessage(c.params), frameworktest.Handle(t))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.(*longprompt.Scorer).PromptBytes(); got != c.want {
				t.Fatalf("PromptBytes %d, want %d", got, c.want)
			}
		})
	}
	// A second registration of the type is refused.
	r := plugins(t)
	if err := r.Register(longprompt.Type, longprompt.New); err == nil {
		t.Fatal("registering the type again succeeded")
	}
	o := scheduling.Options{Registry: r, ConfigText: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: long-prompt-scorer\n  parameters: {minPromptBytes: -5}\n"}
	if _, err := o.LoadConfig(); err == nil || !strings.Contains(err.Error(), "long-prompt-scorer") {
		t.Fatalf("a bad parameter in a config: %v, want an error naming the plugin", err)
	}
}

// plugins are the built-in plugins and long-prompt-scorer, as
// app.WithPlugin(longprompt.Type, longprompt.New) makes them.
func plugins(t *testing.T) *framework.Registry {
	t.Helper()
	r := scheduling.NewRegistry()
	if err := r.Register(longprompt.Type, longprompt.New); err != nil {
		t.Fatal(err)
	}
	return r
}

// pool is a pool of three endpoints, the second one's pod labelled
// label=value, each with the same fresh scrape.
func pool(label, value string) *frameworktest.Pool {
	eps := []*frameworktest.Endpoint{
		frameworktest.NewEndpoint("127.0.0.11:8000", map[string]string{"app": "m"}),
		frameworktest.NewEndpoint("127.0.0.12:8000", map[string]string{"app": "m", label: value}),
		frameworktest.NewEndpoint("127.0.0.13:8000", map[string]string{"app": "m"}),
	}
	for _, e := range eps {
		e.SetScrape(frameworktest.Load(0, 0.1))
	}
	return frameworktest.NewPool("ns", "pool", eps...)
}

// TestScore runs the scorer as the scheduler does, on endpoints built
// with frameworktest: a long prompt scores the labelled endpoint 1 and the
// others 0, a short one the reverse.
func TestScore(t *testing.T) {
	cases := []struct {
		name, params string
		label, value string
		promptBytes  int
		want         []float64
	}{
		{"short prompt", "", longprompt.DefaultLabel, "true", 1000, []float64{1, 0, 1}},
		{"long prompt", "", longprompt.DefaultLabel, "true", 9000, []float64{0, 1, 0}},
		{"at the threshold", "", longprompt.DefaultLabel, "true", longprompt.DefaultMinPromptBytes, []float64{0, 1, 0}},
		{"no prompt", "", longprompt.DefaultLabel, "true", 0, []float64{1, 0, 1}},
		{"own threshold", `{"minPromptBytes": 100}`, longprompt.DefaultLabel, "true", 100, []float64{0, 1, 0}},
		{"own label", `{"label": "gpu/long"}`, "gpu/long", "true", 9000, []float64{0, 1, 0}},
		{"label not true", "", longprompt.DefaultLabel, "yes", 9000, []float64{0, 0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := frameworktest.Build(t, longprompt.New, "long", c.params).(framework.Scorer)
			cs := frameworktest.NewCycle(pool(c.label, c.value), "m", 1)
			req := &framework.Request{Prompt: []byte(strings.Repeat("x", c.promptBytes))}
			got, st := frameworktest.Score(t, s, cs, req, frameworktest.Candidates(cs))
			if st != nil || !slices.Equal(got, c.want) {
				t.Fatalf("scores %v, status %v; want %v and none", got, st, c.want)
			}
		})
	}
}

// TestConfigFile builds a scheduler from the example's config file with
// the plugin registered, as a binary with app.WithPlugin does: the scorer
// is in it, and the scheduler hands it the 20,000 bytes of prompt it asks
// for (framework.PromptReader), past the 16 KiB the default scorers read.
func TestConfigFile(t *testing.T) {
	sched, err := scheduling.New(nil, scheduling.Options{ConfigFile: "testdata/config.yaml", Registry: plugins(t)})
	if err != nil {
		t.Fatal(err)
	}
	if got := sched.PromptBytes(); got != 20000 {
		t.Fatalf("scheduler reads %d bytes of prompt, want the scorer's 20000", got)
	}
}
