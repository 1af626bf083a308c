// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// The model servers a fleet can run (-sim).
const (
	// simModelsim is poolpicker's simulator, in this process.
	simModelsim = "modelsim"
	// simLLMD is the llm-d project's vLLM simulator
	// (github.com/llm-d/llm-d-inference-sim), an independently written
	// simulator run as one process per server from a binary built from
	// its public source (-llmd-sim-bin); it is no dependency of any
	// poolpicker module.
	simLLMD = "llm-d"
)

// modelServer is one model server of a fleet.
type modelServer interface {
	Name() string
	// queue is the requests the server runs and queues now.
	queue() int
	// summary is the server's counters, for -v.
	summary() string
	Stop()
}

// simServer is a modelsim server of a fleet.
type simServer struct{ *modelsim.Server }

func (s simServer) queue() int { st := s.State(); return st.Running + st.Waiting }

func (s simServer) summary() string {
	st := s.Stats()
	return fmt.Sprintf("%d served, %.2f cached, peak %d running %d waiting", st.Completed,
		float64(st.CachedPromptTokens)/float64(max(st.PromptTokens, 1)), st.PeakRunning, st.PeakWaiting)
}

// llmdServer is one llm-d simulator process. The simulator listens on
// every interface (it takes a port, not an address), so several cannot
// share the pool's target port on their own loopback IPs: each listens on
// a port of its own, and a forwarder on the pod's IP and the pool's target
// port relays connections to it, as a pod's IP reaches its container.
type llmdServer struct {
	name    string
	cmd     *exec.Cmd
	exited  chan struct{}
	fwd     net.Listener
	conns   sync.WaitGroup
	target  string // 127.0.0.1:port of the process
	metrics *http.Client
	stderr  *tailBuffer
}

// llmdArgs maps the sweep's fleet to the simulator's flags (read from its
// source, pkg/common/config.go): the same slots, KV cache and per-token
// prefill and decode costs, each divided by the time scale as modelsim
// divides its own, and its load factor (every step slower by the given
// factor with max-num-seqs running, less with fewer) at the slowdown of a
// full batch.
func llmdArgs(c *sweepConfig, server, port int, seed uint64) []string {
	d := func(v time.Duration) string { return scaled(v, c.timeScale).String() }
	perToken := time.Duration(float64(c.prefillPerToken) / c.timeScale)
	args := []string{
		"--model", modelsim.DefaultModel,
		"--port", strconv.Itoa(port),
		"--max-num-seqs", strconv.Itoa(c.slotsOf(server)),
		"--max-model-len", strconv.Itoa(4 * (c.prefixTokens + c.suffixTokens + c.outputTokens)),
		"--enable-kvcache=true",
		"--kv-cache-size", strconv.Itoa(c.kvBlocksOf(server)),
		"--block-size", strconv.Itoa(c.blockTokens),
		"--latency-calculator", "per-token",
		"--prefill-overhead", d(c.prefillOverhead),
		"--prefill-time-per-token", perToken.String(),
		"--inter-token-latency", d(c.decodePerToken),
		"--time-factor-under-load", strconv.FormatFloat(1+c.loadSlowdown*float64(c.slotsOf(server)-1), 'f', -1, 64),
		"--force-dummy-tokenizer=true",
		"--seed", strconv.FormatUint(seed, 10),
	}
	if c.loraAdapters > 0 {
		args = append(args, "--max-loras", strconv.Itoa(c.maxLoRAs), "--max-cpu-loras", strconv.Itoa(c.loraAdapters), "--lora-modules")
		for i := range c.loraAdapters {
			args = append(args, fmt.Sprintf(`{"name":%q,"path":"/adapters/%s","base_model_name":%q}`, loraName(i), loraName(i), modelsim.DefaultModel))
		}
	}
	return args
}

// startLLMD starts the simulator for the fleet's server number server,
// listening (through a forwarder) on ln, and returns once it answers. Its
// KV-cache events go to kvEndpoint ("": nowhere), with a replay socket
// bound at replayEndpoint ("": none).
func startLLMD(ctx context.Context, bin string, c *sweepConfig, server int, ln net.Listener, name string, seed uint64, kvEndpoint, replayEndpoint string) (_ *llmdServer, err error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ip, _, _ := net.SplitHostPort(ln.Addr().String())
	args := llmdArgs(c, server, port, seed)
	if kvEndpoint == "" {
		// KV events go to an address where nothing listens (the
		// simulator dials it, and retries in the background): the picker
		// reads the cache through the responses' usage, as it does from
		// vLLM.
		kvEndpoint = "tcp://" + net.JoinHostPort(ip, "1")
	}
	args = append(args, "--zmq-endpoint", kvEndpoint, "--hash-seed", llmdHashSeed, "--event-batch-size", strconv.Itoa(max(c.kvEventBatch, 1)))
	if replayEndpoint != "" {
		args = append(args, "--kv-events-replay-endpoint", replayEndpoint)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "POD_IP="+ip)
	s := &llmdServer{name: name, cmd: cmd, exited: make(chan struct{}), fwd: ln, target: fmt.Sprintf("127.0.0.1:%d", port),
		metrics: &http.Client{Timeout: 5 * time.Second}, stderr: &tailBuffer{max: 4096}}
	cmd.Stdout, cmd.Stderr = io.Discard, s.stderr
	if err := cmd.Start(); err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := s.metrics.Get("http://" + s.target + "/v1/models")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited at start: %s", name, s.stderr.String())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not answer within 30s: %s", name, s.stderr.String())
		}
	}
	go s.forward()
	return s, nil
}

// forward relays each connection on the pod's address to the process.
func (s *llmdServer) forward() {
	for {
		in, err := s.fwd.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			defer in.Close()
			out, err := net.Dial("tcp", s.target)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(out, in)
				_ = out.(*net.TCPConn).CloseWrite() // the peer sees EOF either way
				close(done)
			}()
			_, _ = io.Copy(in, out)
			_ = in.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

func (s *llmdServer) Name() string { return s.name }

// Stop ends the process and the forwarder with its connections.
func (s *llmdServer) Stop() {
	s.fwd.Close()
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.conns.Wait()
}

// gauges reads the named series of the process's metrics page, summed
// over their labels.
func (s *llmdServer) gauges(names ...string) map[string]float64 {
	out := map[string]float64{}
	resp, err := s.metrics.Get("http://" + s.target + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, n := range names {
			rest, ok := strings.CutPrefix(line, n)
			if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				out[n] += v
			}
		}
	}
	return out
}

func (s *llmdServer) queue() int {
	g := s.gauges("vllm:num_requests_running", "vllm:num_requests_waiting")
	return int(g["vllm:num_requests_running"] + g["vllm:num_requests_waiting"])
}

func (s *llmdServer) summary() string {
	g := s.gauges("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total")
	return fmt.Sprintf("%.0f served, %.2f cached", g["vllm:request_success_total"],
		g["vllm:prefix_cache_hits_total"]/max(g["vllm:prefix_cache_queries_total"], 1))
}

// freePort is a TCP port free on every interface now.
func freePort() (int, error) {
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// checkSim checks -sim and -llmd-sim-bin.
func checkSim(sim, bin string) error {
	switch sim {
	case simModelsim:
		return nil
	case simLLMD:
		if bin == "" {
			return errors.New("-sim llm-d needs -llmd-sim-bin, the simulator built from github.com/llm-d/llm-d-inference-sim")
		}
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("-llmd-sim-bin: %w", err)
		}
		return nil
	}
	return fmt.Errorf("-sim %q: want %s or %s", sim, simModelsim, simLLMD)
}
