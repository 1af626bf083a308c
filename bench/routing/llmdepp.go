// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// The llm-d routers run llm-d's endpoint picker (cmd/epp of
// github.com/llm-d/llm-d-router, formerly llm-d-inference-scheduler),
// built from its public source for the benchmark only (-llmd-epp; never
// a dependency of any poolpicker module), against the control plane as
// the reference EPP runs (reference.go), with the same common flags.
//
// llm-d runs it with its built-in default configuration (queue 2,
// KV-cache use 2, approximate prefix cache 3, max-score picker).
// llm-d-precise runs its precise prefix-cache configuration, as its
// sample epp-precise-prefix-cache-config.yaml lays it out (the token
// producer, the precise-prefix-cache producer feeding the prefix-cache
// scorer, weight 2; KV-cache use and queue, weight 1 each): the prompts
// are tokenized by the fleet's first server's render endpoint, and the
// servers (-sim llm-d) publish their KV-cache events to it (kvRelay).
const (
	llmdRouterName        = "llm-d"
	llmdPreciseRouterName = "llm-d-precise"
)

// llmdBinary is llm-d's EPP binary (-llmd-epp).
var llmdBinary string

const llmdBuild = "build it from github.com/llm-d/llm-d-router's cmd/epp (bench/routing/NOTES.md says how)"

var (
	llmdEPP        = externalEPP{binary: &llmdBinary, flag: "-llmd-epp", build: llmdBuild}
	llmdPreciseEPP = externalEPP{binary: &llmdBinary, flag: "-llmd-epp", build: llmdBuild, args: llmdPreciseArgs, kvEvents: true}

	llmdRouter        = router{name: llmdRouterName, replicas: []int{1}, external: &llmdEPP}
	llmdPreciseRouter = router{name: llmdPreciseRouterName, replicas: []int{1}, external: &llmdPreciseEPP}
)

// llmdHashSeed is the block-hash seed of the servers' KV events and of the
// precise picker's block keys (vLLM's PYTHONHASHSEED): they must agree.
const llmdHashSeed = "42"

// llmdPreciseArgs is the precise configuration for fleet f.
func llmdPreciseArgs(c *sweepConfig, f *fleet) []string {
	return []string{"--config-text", llmdPreciseConfig(modelsim.DefaultModel, "http://"+f.renderAddr, f.kv.eppEndpoints[0], c.blockTokens)}
}

// llmdPreciseConfig is llm-d's precise prefix-cache sample configuration
// for the model served at renderURL, its KV events bound at zmqEndpoint.
func llmdPreciseConfig(model, renderURL, zmqEndpoint string, blockTokens int) string {
	return fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: %q
    vllm:
      url: %q
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig:
      blockSize: %d
      hashSeed: %q
    kvEventsConfig:
      zmqEndpoint: %q
      discoverPods: false
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`, model, renderURL, blockTokens, llmdHashSeed, zmqEndpoint)
}

// kvRelay carries a fleet's KV-cache events from its servers to its
// pickers (llm-d's EPP, or each poolpicker replica whose config scores
// from events). The llm-d simulator names its events' topic
// kv@<POD_IP>:<its own port>@<model>, and the picker finds a server's
// blocks by its pod's address and the pool's target port; each simulator
// listens on a port of its own behind the pod's forwarder (llmdServer),
// so the relay rewrites the topic's port to the pool's, as a server
// listening on the target port itself would name it. Nothing else of an
// event changes.
type kvRelay struct {
	// serverEndpoint is where the servers publish (the relay's SUB binds
	// it), eppEndpoints where each picker's SUB binds (the relay dials
	// them all).
	serverEndpoint string
	eppEndpoints   []string
	// replayPort is the port of each server's replay (ROUTER) socket, on
	// its pod's IP.
	replayPort int
	targetPort int
	cancel     context.CancelFunc
	done       sync.WaitGroup
}

// startKVRelay binds the servers' side of a relay for a pool on
// targetPort with pickers pickers; the pickers' sides are dialed in the
// background, retried until each picker binds its own.
func startKVRelay(ctx context.Context, targetPort, pickers int) (*kvRelay, error) {
	ports, err := freePorts(1 + pickers)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &kvRelay{serverEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", ports[0]), targetPort: targetPort, cancel: cancel}
	for _, p := range ports[1:] {
		r.eppEndpoints = append(r.eppEndpoints, fmt.Sprintf("tcp://127.0.0.1:%d", p))
	}
	sub := zmq4.NewSub(ctx)
	if err := sub.Listen(r.serverEndpoint); err != nil {
		cancel()
		return nil, fmt.Errorf("KV-event relay: %w", err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		sub.Close()
		return nil, fmt.Errorf("KV-event relay: %w", err)
	}
	pub := zmq4.NewPub(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		defer sub.Close()
		defer pub.Close()
		// The pickers bind their sides once they run: dial in the
		// background (the dialer retries), one after the other (a zmq4
		// socket's Dial is not safe for concurrent use); events before
		// every picker is dialed are dropped, as a PUB socket without
		// subscribers drops them (a picker that follows sequence numbers
		// replays them).
		dialed := make(chan error, 1)
		go func() {
			for _, e := range r.eppEndpoints {
				if err := pub.Dial(e); err != nil {
					dialed <- err
					return
				}
			}
			dialed <- nil
		}()
		waiting := 1
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) > 0 {
				msg.Frames[0] = rewriteTopicPort(msg.Frames[0], r.targetPort)
			}
		drain:
			for waiting > 0 {
				select {
				case err := <-dialed:
					if err != nil {
						return
					}
					waiting--
				default:
					break drain
				}
			}
			if waiting > 0 {
				continue
			}
			if err := pub.Send(msg); err != nil && !errors.Is(err, context.Canceled) {
				return
			}
		}
	}()
	return r, nil
}

func (r *kvRelay) stop() {
	r.cancel()
	r.done.Wait()
}

// rewriteTopicPort sets the port of a kv@<ip>:<port>@<model> topic; any
// other topic is returned as it is.
func rewriteTopicPort(topic []byte, port int) []byte {
	parts := bytes.SplitN(topic, []byte("@"), 3)
	if len(parts) != 3 || string(parts[0]) != "kv" {
		return topic
	}
	host, _, err := net.SplitHostPort(string(parts[1]))
	if err != nil {
		return topic
	}
	return []byte(strings.Join([]string{"kv", net.JoinHostPort(host, strconv.Itoa(port)), string(parts[2])}, "@"))
}
