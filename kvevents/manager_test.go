// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package kvevents_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/kvevents"
)

func TestMain(m *testing.M) {
	// go-zeromq/zmq4's PUB socket never stops its writer goroutine on
	// Close; the simulators' publishers leave one each.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

const model = "base-model"

// nextIP hands out a loopback address per simulated pod.
var nextIP atomic.Int32

func init() { nextIP.Store(40) }

func podIP() string {
	n := int(nextIP.Add(1))
	return "127.0." + strconv.Itoa(n/250) + "." + strconv.Itoa(n%250+1)
}

// freePort is a port free on ip now.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// sim starts a model server on its own loopback IP publishing KV events.
func sim(t *testing.T, ev modelsim.KVEventsOptions, opts modelsim.Options) *modelsim.Server {
	t.Helper()
	ip := podIP()
	if ev.Endpoint == "" {
		ev.Endpoint = "tcp://" + ip + ":0"
	}
	if ev.ReplayEndpoint == "replay" {
		ev.ReplayEndpoint = "tcp://" + ip + ":0"
	}
	opts.Addr, opts.Model, opts.KVEvents = ip+":0", model, &ev
	if opts.BlockSizeTokens == 0 {
		opts.BlockSizeTokens = 4
	}
	opts.PrefillPerToken, opts.DecodePerToken, opts.DefaultMaxTokens = -1, -1, 1
	s, err := modelsim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func manager(t *testing.T, opts kvevents.Options) (*kvevents.Manager, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if opts.Hasher == nil {
		h, err := kvevents.NewHasher(4, "", "")
		if err != nil {
			t.Fatal(err)
		}
		opts.Hasher = h
	}
	opts.Registerer = reg
	m, err := kvevents.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); m.Wait() })
	return m, reg
}

// complete sends a completion to s and returns its cached prompt tokens.
func complete(t *testing.T, s *modelsim.Server, prompt string) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt)
	resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion: %d %v", resp.StatusCode, err)
	}
	return out.Usage.Details.Cached
}

// keys are the prompt's block keys from the server's own tokenization.
func keys(t *testing.T, s *modelsim.Server, h *kvevents.Hasher, prompt string) []uint64 {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt)
	resp, err := http.Post("http://"+s.Addr()+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return h.Keys(nil, h.Root(model), out.Tokens)
}

// prompt is n blocks of 4 tokens of 4 bytes, distinct per tag.
func prompt(tag string, n int) string {
	return strings.Repeat(fmt.Sprintf("%-16s", tag), n)
}

// held awaits the event index of s's endpoint holding exactly want of the
// prompt's leading keys.
func held(t *testing.T, m *kvevents.Manager, s *modelsim.Server, k []uint64, want int) {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("the event index holding %d blocks of the prompt", want), func() bool {
		ep := m.Endpoint("ns", "pool", s.Addr())
		n, ok := ep.Match(k)
		return ok && n == want
	})
}

func TestSubscriptionFollowsServer(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("named fields %v", named), func(t *testing.T) {
			h, _ := kvevents.NewHasher(4, "7", "")
			s := sim(t, modelsim.KVEventsOptions{HashSeed: "7", NamedFields: named, ReplayEndpoint: "replay"}, modelsim.Options{NumGPUBlocks: 24})
			m, reg := manager(t, kvevents.Options{Hasher: h, SocketPort: port(t, s.KVEventsAddr()), ReplayPort: port(t, s.KVReplayAddr())})
			m.Add("ns", "pool", s.Addr())
			a := prompt("a", 10)
			ka := keys(t, s, h, a)
			if got := complete(t, s, a); got != 0 {
				t.Fatalf("first request cached %d tokens", got)
			}
			held(t, m, s, ka, 10)
			// The server confirms what the index holds (less the last
			// token, which it always computes).
			if got := complete(t, s, a); got != 9*4 {
				t.Errorf("second request cached %d tokens, want 36", got)
			}
			// A prompt that fills the cache evicts a's blocks; the index
			// learns it from the BlockRemoved events.
			b := prompt("b", 20)
			complete(t, s, b)
			held(t, m, s, keys(t, s, h, b), 20)
			n, _ := m.Endpoint("ns", "pool", s.Addr()).Match(ka)
			if got := complete(t, s, a); got != min(n, 9)*4 {
				t.Errorf("after eviction the index predicts %d blocks, the server cached %d tokens", n, got)
			}
			// The first events may have come by replay; live ones are
			// counted.
			connected(t, m, reg, s)
			m.Remove("ns", "pool", s.Addr())
			if m.Endpoint("ns", "pool", s.Addr()) != nil {
				t.Error("a removed endpoint is still indexed")
			}
		})
	}
}

// replayHolds awaits s's replay socket holding at least n batches: what
// s published, whether or not anyone subscribed.
func replayHolds(t *testing.T, s *modelsim.Server, n int) {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("%d batches published", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d := zmq4.NewDealer(ctx)
		defer d.Close()
		if err := d.Dial("tcp://" + s.KVReplayAddr()); err != nil {
			t.Fatal(err)
		}
		if err := d.Send(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			msg, err := d.Recv()
			if err != nil {
				t.Fatal(err)
			}
			f := msg.Frames
			if len(f) < 2 || binary.BigEndian.Uint64(f[len(f)-2]) == kvevents.ReplayDone {
				return got >= n
			}
			got++
		}
	})
}

// TestEventsBeforeSubscription: what a server published before the
// subscription reached it (ZMQ's slow joiner) is recovered from its replay
// socket, with no later event to reveal the gap.
func TestEventsBeforeSubscription(t *testing.T) {
	for _, listen := range []bool{false, true} {
		t.Run(fmt.Sprintf("the server dials the picker %v", listen), func(t *testing.T) {
			h, _ := kvevents.NewHasher(4, "", "")
			ev := modelsim.KVEventsOptions{ReplayEndpoint: "replay"}
			opts := kvevents.Options{Hasher: h}
			if listen {
				ip := podIP()
				opts.ListenEndpoint = fmt.Sprintf("tcp://%s:%d", ip, freePort(t, ip))
				ev.Endpoint, ev.Dial = opts.ListenEndpoint, true
			}
			s := sim(t, ev, modelsim.Options{})
			if !listen {
				opts.SocketPort = port(t, s.KVEventsAddr())
			}
			opts.ReplayPort = port(t, s.KVReplayAddr())
			a, b := prompt("early-a", 6), prompt("early-b", 4)
			complete(t, s, a)
			complete(t, s, b)
			replayHolds(t, s, 2)
			m, reg := manager(t, opts)
			m.Add("ns", "pool", s.Addr())
			held(t, m, s, keys(t, s, h, a), 6)
			held(t, m, s, keys(t, s, h, b), 4)
			if !m.Endpoint("ns", "pool", s.Addr()).Confirmed() {
				t.Error("the index rebuilt from the server's whole history is not trusted")
			}
			if v := promtest.Value(reg, kvevents.MetricLLMDMessages, map[string]string{"pod_identifier": s.Addr()}); v != 0 {
				t.Errorf("%s = %v: the events came live, not by replay", kvevents.MetricLLMDMessages, v)
			}
			// Live events go on from there, without a gap.
			c := prompt("late-c", 3)
			complete(t, s, c)
			held(t, m, s, keys(t, s, h, c), 3)
			if v := promtest.PoolSum(reg, kvevents.MetricGaps, "ns", "pool"); v != 0 {
				t.Errorf("%s = %v after catching up", kvevents.MetricGaps, v)
			}
		})
	}
}

// connected sends distinct prompts to s until m has received a message of
// its stream, and returns how many it sent.
func connected(t *testing.T, m *kvevents.Manager, reg *prometheus.Registry, s *modelsim.Server) int {
	t.Helper()
	n := 0
	poll.Until(t, 10*time.Second, "a first KV event message", func() bool {
		n++
		complete(t, s, prompt(fmt.Sprintf("warm%d", n), 2))
		return promtest.Value(reg, kvevents.MetricLLMDMessages, map[string]string{"pod_identifier": s.Addr()}) > 0
	})
	return n
}

func TestGaps(t *testing.T) {
	for _, tt := range []struct {
		name   string
		replay bool
		listen bool
	}{
		{name: "healed by replay", replay: true},
		{name: "healed by replay, the server dials the picker", replay: true, listen: true},
		{name: "without replay the endpoint restarts unconfirmed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := kvevents.NewHasher(4, "", "")
			// Once armed, the next batch the server publishes is lost on
			// the way (kept for replay).
			var armed atomic.Bool
			var dropped atomic.Uint64
			ev := modelsim.KVEventsOptions{DropLive: func(seq uint64) bool {
				return armed.Load() && dropped.CompareAndSwap(0, seq)
			}}
			if tt.replay {
				ev.ReplayEndpoint = "replay"
			}
			// No second catch-up (follow, settle) during the test: the gap
			// must show in the live messages.
			opts := kvevents.Options{Hasher: h, RetryInterval: time.Minute}
			if tt.listen {
				ip := podIP()
				opts.ListenEndpoint = fmt.Sprintf("tcp://%s:%d", ip, freePort(t, ip))
				ev.Endpoint, ev.Dial = opts.ListenEndpoint, true
			}
			// The server first: a dialing publisher retries until the
			// picker listens.
			s := sim(t, ev, modelsim.Options{})
			if !tt.listen {
				opts.SocketPort = port(t, s.KVEventsAddr())
			}
			if tt.replay {
				opts.ReplayPort = port(t, s.KVReplayAddr())
			}
			m, reg := manager(t, opts)
			m.Add("ns", "pool", s.Addr())
			connected(t, m, reg, s)
			// Batches the warm-up lost before the subscription reached the
			// server may have shown as a gap already.
			gaps := promtest.PoolSum(reg, kvevents.MetricGaps, "ns", "pool")
			resyncs := promtest.PoolSum(reg, kvevents.MetricResyncs, "ns", "pool")
			armed.Store(true)
			// A request's events may share a batch with the next's: prompts
			// go on until a batch after the lost one shows the gap.
			var prompts []string
			poll.Until(t, 10*time.Second, "the gap seen", func() bool {
				p := prompt(fmt.Sprintf("p%d", len(prompts)), 3)
				prompts = append(prompts, p)
				complete(t, s, p)
				return promtest.PoolSum(reg, kvevents.MetricGaps, "ns", "pool") == gaps+1
			})
			if tt.replay {
				for _, p := range prompts {
					held(t, m, s, keys(t, s, h, p), 3)
				}
				if v := promtest.PoolSum(reg, kvevents.MetricResyncs, "ns", "pool"); v != resyncs {
					t.Errorf("%s = %v after a replayed gap", kvevents.MetricResyncs, v)
				}
				return
			}
			// The gap is counted before the index is cleared.
			poll.Until(t, 10*time.Second, "the index cleared", func() bool {
				return promtest.PoolSum(reg, kvevents.MetricResyncs, "ns", "pool") == resyncs+1
			})
			if _, ok := m.Endpoint("ns", "pool", s.Addr()).Match(keys(t, s, h, prompts[len(prompts)-1])); ok {
				t.Error("after a gap without replay the endpoint's index is still trusted")
			}
			if v := promtest.PoolSum(reg, kvevents.MetricUnconfirmed, "ns", "pool"); v != 1 {
				t.Errorf("%s = %v, want 1", kvevents.MetricUnconfirmed, v)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	for _, tt := range []struct {
		name   string
		opts   kvevents.Options
		reason string
		check  func(t *testing.T, ep *kvevents.Endpoint)
	}{
		{name: "blocks per endpoint", opts: kvevents.Options{MaxBlocksPerEndpoint: 5}, reason: kvevents.DropBlocks,
			check: func(t *testing.T, ep *kvevents.Endpoint) {
				if n := ep.Blocks(); n > 5 {
					t.Errorf("%d blocks indexed, the bound is 5", n)
				}
			}},
		{name: "process budget", opts: kvevents.Options{Budget: &budget{left: 3}}, reason: kvevents.DropBudget,
			check: func(t *testing.T, ep *kvevents.Endpoint) {
				if n := ep.Blocks(); n > 3 {
					t.Errorf("%d blocks indexed, the budget is 3", n)
				}
			}},
		{name: "message bytes", opts: kvevents.Options{MaxMessageBytes: 8}, reason: kvevents.DropSize},
		{name: "events per second", opts: kvevents.Options{EventsPerSecond: 1}, reason: kvevents.DropRate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := sim(t, modelsim.KVEventsOptions{ReplayEndpoint: "replay"}, modelsim.Options{})
			tt.opts.SocketPort, tt.opts.ReplayPort = port(t, s.KVEventsAddr()), port(t, s.KVReplayAddr())
			m, reg := manager(t, tt.opts)
			m.Add("ns", "pool", s.Addr())
			poll.Until(t, 10*time.Second, "events refused for "+tt.reason, func() bool {
				complete(t, s, prompt(fmt.Sprintf("%d", time.Now().UnixNano()), 10))
				return promtest.Value(reg, kvevents.MetricDropped, map[string]string{"namespace": "ns", "pool": "pool", "reason": tt.reason}) > 0
			})
			if tt.check != nil {
				tt.check(t, m.Endpoint("ns", "pool", s.Addr()))
			}
		})
	}
}

// budget is a process-wide block budget of a fixed size.
type budget struct {
	mu   sync.Mutex
	left int
}

func (b *budget) Reserve(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.left {
		return false
	}
	b.left -= n
	return true
}

func (b *budget) Release(n int) {
	b.mu.Lock()
	b.left += n
	b.mu.Unlock()
}

// TestServerRestart: a server that restarts (its history begins again) is
// caught up with when the subscription dials it again: the index is rebuilt
// from the new history, the old server's blocks gone, with no live event
// after the restart needed to show it.
func TestServerRestart(t *testing.T) {
	h, _ := kvevents.NewHasher(4, "", "")
	ip := podIP()
	httpPort, pubPort, replayPort := freePort(t, ip), freePort(t, ip), freePort(t, ip)
	start := func(dropLive func(uint64) bool) *modelsim.Server {
		s, err := modelsim.New(modelsim.Options{Addr: fmt.Sprintf("%s:%d", ip, httpPort), Model: model, BlockSizeTokens: 4,
			PrefillPerToken: -1, DecodePerToken: -1, DefaultMaxTokens: 1,
			KVEvents: &modelsim.KVEventsOptions{Endpoint: fmt.Sprintf("tcp://%s:%d", ip, pubPort), ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", ip, replayPort), DropLive: dropLive}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := start(nil)
	m, _ := manager(t, kvevents.Options{Hasher: h, SocketPort: pubPort, ReplayPort: replayPort, RetryInterval: 20 * time.Millisecond})
	m.Add("ns", "pool", first.Addr())
	// More batches on the first server than the second will have.
	var ka []uint64
	for i := range 4 {
		a := prompt(fmt.Sprintf("before%d", i), 3)
		complete(t, first, a)
		ka = keys(t, first, h, a)
		held(t, m, first, ka, 3)
	}
	first.Stop()
	// Its connections are gone with it.
	http.DefaultClient.CloseIdleConnections()
	// The second server's first batch is never published live: only the
	// catch-up on the new connection can learn it.
	second := start(func(seq uint64) bool { return seq == 1 })
	t.Cleanup(second.Stop)
	b := prompt("after", 5)
	complete(t, second, b)
	held(t, m, second, keys(t, second, h, b), 5)
	poll.Until(t, 10*time.Second, "the first server's blocks forgotten", func() bool {
		n, ok := m.Endpoint("ns", "pool", second.Addr()).Match(ka)
		return ok && n == 0
	})
}

// poolBudget is a PoolBudget without bound that counts what each pool's
// account holds.
type poolBudget struct {
	mu   sync.Mutex
	held map[string]int
}

func (b *poolBudget) Reserve(n int) bool { return b.ForPool("", "").Reserve(n) }
func (b *poolBudget) Release(n int)      { b.ForPool("", "").Release(n) }

func (b *poolBudget) ForPool(namespace, pool string) kvevents.Budget {
	return poolAccount{b, namespace + "/" + pool}
}

func (b *poolBudget) holds(account string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[account]
}

type poolAccount struct {
	b    *poolBudget
	name string
}

func (a poolAccount) Reserve(n int) bool {
	a.b.mu.Lock()
	defer a.b.mu.Unlock()
	a.b.held[a.name] += n
	return true
}

func (a poolAccount) Release(n int) {
	a.b.mu.Lock()
	defer a.b.mu.Unlock()
	a.b.held[a.name] -= n
}

// TestPoolsSharingEndpoint: two pools whose selectors share a server each
// index it, each pool's blocks on its own account; removing one pool
// releases its blocks and leaves the other's index fed, whether the
// picker dials the server or the server dials the picker.
func TestPoolsSharingEndpoint(t *testing.T) {
	for _, listen := range []bool{false, true} {
		t.Run(fmt.Sprintf("the server dials the picker %v", listen), func(t *testing.T) {
			h, _ := kvevents.NewHasher(4, "", "")
			ev := modelsim.KVEventsOptions{ReplayEndpoint: "replay"}
			b := &poolBudget{held: map[string]int{}}
			opts := kvevents.Options{Hasher: h, Budget: b}
			if listen {
				ip := podIP()
				opts.ListenEndpoint = fmt.Sprintf("tcp://%s:%d", ip, freePort(t, ip))
				ev.Endpoint, ev.Dial = opts.ListenEndpoint, true
			}
			s := sim(t, ev, modelsim.Options{})
			if !listen {
				opts.SocketPort = port(t, s.KVEventsAddr())
			}
			opts.ReplayPort = port(t, s.KVReplayAddr())
			m, reg := manager(t, opts)
			m.Add("ns", "a", s.Addr())
			m.Add("ns", "b", s.Addr())
			heldBy := func(pool string, k []uint64, want int) {
				t.Helper()
				poll.Until(t, 10*time.Second, fmt.Sprintf("pool %s's event index holding %d blocks of the prompt", pool, want), func() bool {
					n, ok := m.Endpoint("ns", pool, s.Addr()).Match(k)
					return ok && n == want
				})
			}
			x := prompt("shared-x", 6)
			complete(t, s, x)
			kx := keys(t, s, h, x)
			heldBy("a", kx, 6)
			heldBy("b", kx, 6)
			if a, b := b.holds("ns/a"), b.holds("ns/b"); a < 6 || b < 6 {
				t.Errorf("accounts hold %d blocks of pool a and %d of pool b, want each pool's at least its 6", a, b)
			}
			if v := promtest.Value(reg, kvevents.MetricLLMDActive, nil); v != 2 {
				t.Errorf("%s = %v, want 2 (one per pool)", kvevents.MetricLLMDActive, v)
			}

			m.Remove("ns", "a", s.Addr())
			if m.Endpoint("ns", "a", s.Addr()) != nil {
				t.Error("a removed pool still indexes the endpoint")
			}
			if n := b.holds("ns/a"); n != 0 {
				t.Errorf("a removed pool's account still holds %d blocks", n)
			}
			if v := promtest.PoolSum(reg, kvevents.MetricBlocks, "ns", "a"); v != 0 {
				t.Errorf("%s of the removed pool = %v", kvevents.MetricBlocks, v)
			}
			y := prompt("shared-y", 4)
			complete(t, s, y)
			heldBy("b", keys(t, s, h, y), 4)
			if n, ok := m.Endpoint("ns", "b", s.Addr()).Match(kx); !ok || n != 6 {
				t.Errorf("pool b's index holds %d blocks of the first prompt (confirmed %v), want 6", n, ok)
			}
			// Added back, pool a catches up with the server's history.
			m.Add("ns", "a", s.Addr())
			heldBy("a", kx, 6)
		})
	}
}
