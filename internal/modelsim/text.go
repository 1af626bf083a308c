// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"
)

// vocabulary is what simulated models say; one word is one output token.
var vocabulary = [...]string{
	"the", "model", "server", "answers", "with", "tokens", "that", "a", "picker",
	"routes", "to", "pool", "of", "pods", "cache", "prefix", "is", "warm", "and",
	"queue", "short", "request", "adapter", "loaded", "on", "GPU", "blocks", "kept",
	"in", "memory", "for", "reuse", "when", "prompts", "share", "their", "start",
	"latency", "grows", "under", "load", "so", "spread", "work", "evenly", "across",
	"replicas", "while", "keeping", "hot", "data", "near", "compute", "it", "can",
	"serve", "many", "users", "at", "once", "fast", "simple", "local", "test",
}

// generation is the deterministic part of one request's answer: its output
// words and the jitter of its steps, drawn from streams seeded by the server
// seed, the model and the prompt.
type generation struct {
	words  []string
	finish string
	jitter *rand.Rand
	amount float64
}

func newGeneration(seed uint64, model string, prompt []byte, maxTokens int, explicit bool, jitter float64) *generation {
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.Write([]byte{0})
	_, _ = d.Write(prompt)
	key := d.Sum64()
	words := rand.New(rand.NewPCG(seed, key))
	n, finish := maxTokens, "length"
	if !explicit {
		// Without a limit the model stops by itself somewhere in the upper
		// half of the default length.
		lo := max(1, maxTokens/2)
		n, finish = lo+words.IntN(maxTokens-lo+1), "stop"
	}
	g := &generation{
		words:  make([]string, n),
		finish: finish,
		jitter: rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, key)),
		amount: jitter,
	}
	for i := range g.words {
		g.words[i] = vocabulary[words.IntN(len(vocabulary))]
	}
	return g
}

// token returns output token i as it is streamed: words after the first are
// preceded by a space.
func (g *generation) token(i int) string {
	if i == 0 {
		return g.words[0]
	}
	return " " + g.words[i]
}

// factor is the next step's random time factor in [1-amount, 1+amount].
func (g *generation) factor() float64 {
	if g.amount == 0 {
		return 1
	}
	return 1 + g.amount*(2*g.jitter.Float64()-1)
}
