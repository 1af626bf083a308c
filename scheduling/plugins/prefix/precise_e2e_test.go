// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/promtest"
	"github.com/poolpicker/poolpicker/kvevents"
	"github.com/poolpicker/poolpicker/peersync"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
)

// preciseConfig is llm-d's precise-prefix-cache-scorer configuration, as
// an llm-d user would write it, with the servers' ports.
const preciseConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 16
      hashSeed: "42"
    kvEventsConfig:
      topicFilter: "kv@"
      discoverPods: true
      podDiscoveryConfig:
        socketPort: %d
        replaySocketPort: %d
    indexerConfig:
      kvBlockIndexConfig:
        enableMetrics: true
    tokenizer:
      timeout: 1s
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// freeOn is a port free on each of ips now.
func freeOn(t testing.TB, ips []string) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for _, ip := range ips[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l := range ls {
			_ = l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no port free on every address")
	return 0
}

// preciseServers are model servers publishing their KV events over ZMQ,
// each on its own loopback IP, at the same ports.
type preciseServers struct {
	sims                          []*modelsim.Server
	ips                           []string
	httpPort, pubPort, replayPort int
}

func newPreciseServers(t testing.TB, ips []string) *preciseServers {
	t.Helper()
	return newPreciseServersTokenizing(t, ips, 0)
}

// newPreciseServersTokenizing are preciseServers counting bytesPerToken
// prompt bytes a token (0: modelsim's default, the estimate's).
func newPreciseServersTokenizing(t testing.TB, ips []string, bytesPerToken int) *preciseServers {
	t.Helper()
	ps := &preciseServers{ips: ips, httpPort: freeOn(t, ips), pubPort: freeOn(t, ips), replayPort: freeOn(t, ips)}
	for _, ip := range ips {
		s, err := modelsim.New(modelsim.Options{Addr: net.JoinHostPort(ip, strconv.Itoa(ps.httpPort)), Model: "m", PromptBytesPerToken: bytesPerToken,
			BlockSizeTokens: 16, NumGPUBlocks: 160, MaxNumSeqs: 4, DefaultMaxTokens: 1, PrefillPerToken: -1, DecodePerToken: -1,
			KVEvents: &modelsim.KVEventsOptions{HashSeed: "42",
				Endpoint:       fmt.Sprintf("tcp://%s:%d", ip, ps.pubPort),
				ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", ip, ps.replayPort)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		ps.sims = append(ps.sims, s)
	}
	return ps
}

// precisePool is a picker (the scheduler of config, its ext_proc over
// gRPC) of a pool of preciseServers: send routes a completion through the
// picker, forwards it to the endpoint picked and reports the answer back.
type precisePool struct {
	sims  []*modelsim.Server
	sched *scheduling.Scheduler
	pool  *datastore.Pool
	prom  *prometheus.Registry
	send  func(body []byte)
	// picked is the endpoint the last send went to.
	picked string
	// forwarding, when set, runs after the pick, before the request is
	// forwarded to the endpoint picked (the request is in flight).
	forwarding func(endpoint string)
}

func newPrecisePool(t testing.TB, ips []string, config string) *precisePool {
	t.Helper()
	return newPrecisePicker(t, newPreciseServers(t, ips), config, nil)
}

// newPrecisePicker is a picker of servers ps; with peers, the picker
// shares its picks and in-flight counts with peer replicas over peer sync
// (peers builds its exchange).
func newPrecisePicker(t testing.TB, ps *preciseServers, config string, peers func(reg *datastore.Registry, sched **scheduling.Scheduler, prom prometheus.Registerer) *peersync.Exchange) *precisePool {
	t.Helper()
	pp := &precisePool{prom: prometheus.NewRegistry(), sims: ps.sims}
	reg := datastore.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if strings.Contains(config, "%d") {
		config = fmt.Sprintf(config, ps.pubPort, ps.replayPort)
	}
	so := scheduling.Options{ConfigText: config, Registerer: pp.prom, BaseContext: func() context.Context { return ctx }}
	var exchange *peersync.Exchange
	if peers != nil {
		exchange = peers(reg, &pp.sched, pp.prom)
		so.Peers = exchange
	}
	sched, err := scheduling.New(nil, so)
	if err != nil {
		t.Fatal(err)
	}
	pp.sched = sched
	reg.AddObserver(sched)
	key := types.NamespacedName{Namespace: "ns", Name: "pool"}
	pool := reg.Upsert(key, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{int32(ps.httpPort)}, PickerService: "epp", PickerPort: 9002})
	var srcs []datastore.EndpointSource
	for i, ip := range ps.ips {
		srcs = append(srcs, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}, UID: types.UID(fmt.Sprint(i)), IP: ip})
	}
	pool.SetPods(srcs)
	pool.SetSynced(true)
	for _, e := range pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
	}
	pp.pool = pool
	if exchange != nil {
		reg.AddLoadObserver(exchange)
		synced := make(chan struct{})
		go func() { _ = exchange.Start(ctx); close(synced) }()
		t.Cleanup(func() {
			cancel()
			<-synced
		})
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extproc.New(reg, sched, extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	client := eppclient.New(lis.Addr().String(), eppclient.Options{})
	t.Cleanup(func() { _ = client.Close() })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	httpc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	pp.send = func(body []byte) {
		t.Helper()
		_, err := client.Do(context.Background(), eppclient.Request{Authority: "epp.ns.svc:9002", Body: body, Chunks: 2,
			Forward: func(ctx context.Context, res *eppclient.Result) (*eppclient.Response, error) {
				pp.picked = res.Endpoints()[0]
				if pp.forwarding != nil {
					pp.forwarding(pp.picked)
				}
				resp, err := httpc.Post("http://"+res.Endpoints()[0]+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return &eppclient.Response{Status: resp.StatusCode, Body: b, ServedPrimary: true}, err
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return pp
}

// followed awaits every server's event stream being followed.
func (pp *precisePool) followed(t testing.TB) {
	t.Helper()
	poll.Until(t, 10*time.Second, "every endpoint's event index confirmed", func() bool {
		pp.send(completionBody(fmt.Sprintf("warm-up %d", time.Now().UnixNano()), 1))
		return promtest.PoolSum(pp.prom, kvevents.MetricUnconfirmed, "ns", "pool") == 0 &&
			promtest.Value(pp.prom, kvevents.MetricLLMDActive, nil) == float64(len(pp.sims))
	})
}

// eventsCaughtUp reports, from the call on, whether pp received every
// KV-event batch its servers published, the events they recorded and have
// yet to publish included: those published before a subscription
// connected were replayed, not received live, so the lag at the call is
// the baseline. A batch still on its way at the call would count as
// replayed, and the next one could then be missed: the baseline is taken
// once nothing is pending and the counts stand still, no request being
// under way.
func (pp *precisePool) eventsCaughtUp(t testing.TB) func() bool {
	t.Helper()
	received := func(s *modelsim.Server) float64 {
		return promtest.Value(pp.prom, kvevents.MetricLLMDMessages, map[string]string{"pod_identifier": s.Addr()})
	}
	missed := make([]float64, len(pp.sims))
	lag := func() []float64 {
		l := make([]float64, len(pp.sims))
		for i, s := range pp.sims {
			l[i] = float64(s.KVEventBatches()) - received(s)
		}
		return l
	}
	steady := 0
	poll.Until(t, 10*time.Second, "the servers' event counts standing still", func() bool {
		now := lag()
		if slices.Equal(now, missed) && !pp.eventsPending() {
			steady++
		} else {
			steady = 0
		}
		missed = now
		return steady >= 5
	})
	return func() bool {
		if pp.eventsPending() {
			return false
		}
		for i, s := range pp.sims {
			if float64(s.KVEventBatches())-received(s) > missed[i] {
				return false
			}
		}
		return true
	}
}

// eventsPending reports whether a server of pp has KV events it has not
// yet published.
func (pp *precisePool) eventsPending() bool {
	return slices.ContainsFunc(pp.sims, (*modelsim.Server).KVEventsPending)
}

// postTo sends a completion to s itself, not through a picker: what s
// caches is the test's choice.
func postTo(t testing.TB, s *modelsim.Server, body []byte) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post("http://"+s.Addr()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s answered %d", s.Addr(), resp.StatusCode)
	}
}

// TestPreciseEndToEnd runs llm-d's precise configuration through the
// picker's ext_proc over gRPC against model servers publishing their KV
// events over ZMQ: the servers confirm at least 0.98 of the cached tokens
// the event index predicts, in a workload whose prefixes do not all fit.
func TestPreciseEndToEnd(t *testing.T) {
	pp := newPrecisePool(t, []string{"127.0.91.2", "127.0.91.3", "127.0.91.4"}, preciseConfig)
	send, prom, sims := pp.send, pp.prom, pp.sims
	pp.followed(t)
	// 9 prefixes of 40 blocks over 3 servers of 160 blocks: not all fit.
	// Each request is picked once the events of the one before arrived:
	// what is measured is the index, not the events' time on the wire.
	inSync := pp.eventsCaughtUp(t)
	for round := range 6 {
		for p := range 9 {
			send(completionBody(fmt.Sprintf("prefix %d round %d", p, round), 40))
			poll.Until(t, 10*time.Second, "the servers' events received", inSync)
		}
	}
	labels := map[string]string{"plugin": "precise-prefix-cache-scorer"}
	observed := promtest.Value(prom, prefix.MetricPredictions, labels)
	predicted := promtest.Value(prom, prefix.MetricPredictedTokens, labels)
	confirmed := promtest.Value(prom, prefix.MetricConfirmedTokens, labels)
	if observed < 40 || predicted == 0 {
		t.Fatalf("%v reports of %v predicted tokens: the event index predicted too little", observed, predicted)
	}
	if r := confirmed / predicted; r < 0.98 {
		t.Errorf("servers confirmed %v of %v predicted cached tokens (%.3f), want at least 0.98", confirmed, predicted, r)
	}
	var hits, queries int
	for _, s := range sims {
		st := s.Stats()
		hits, queries = hits+st.CachedPromptTokens, queries+st.PromptTokens
	}
	t.Logf("predictions %v, confirmed %.3f of predicted tokens, servers' hit rate %.3f", observed, confirmed/predicted, float64(hits)/float64(queries))
}

// completionBody is a completion whose prompt is a prefix of blocks
// 16-token blocks (4 bytes a token) named by the part of tag before
// " round", then a suffix unique to tag.
func completionBody(tag string, blocks int) []byte {
	name, _, _ := strings.Cut(tag, " round")
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1,
		"prompt": strings.Repeat(fmt.Sprintf("%-64s", name), blocks) + " question " + tag})
	return b
}

// affinityConfig is preciseConfig with the precise scorer's affinityRules
// and the learned index's rendezvous parameters (without the cache
// balance, which the two indexes of the test would see differently).
const affinityConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 16
      hashSeed: "42"
    kvEventsConfig:
      podDiscoveryConfig:
        socketPort: %d
        replaySocketPort: %d
    tokenizer:
      timeout: 1s
    affinityRules: %s
    approximate:
      queueCostTokens: 192
      rendezvousBlocks: 4
      rendezvousLoadSlack: 8
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// TestPreciseAffinityRules: with affinityRules a prompt no server holds
// goes to the rendezvous choice, the endpoint a replica of the learned
// index with the same parameters (and no knowledge of the pool) picks for
// it, so replicas place new prefixes alike; its next request follows it
// there. Without, the events score every server 0 for it and the choice
// is the load scorers' tie-break. Not set, the rules apply.
func TestPreciseAffinityRules(t *testing.T) {
	for _, tc := range []struct {
		rules string // "absent": the parameter not set
		ips   []string
	}{
		{"true", []string{"127.0.92.2", "127.0.92.3", "127.0.92.4"}},
		{"false", []string{"127.0.93.2", "127.0.93.3", "127.0.93.4"}},
		{"absent", []string{"127.0.94.2", "127.0.94.3", "127.0.94.4"}},
	} {
		t.Run("affinityRules="+tc.rules, func(t *testing.T) {
			config := strings.Replace(affinityConfig, "affinityRules: %s", "affinityRules: "+tc.rules, 1)
			if tc.rules == "absent" {
				config = strings.Replace(affinityConfig, "    affinityRules: %s\n", "", 1)
			}
			pp := newPrecisePool(t, tc.ips, config)
			pp.followed(t)
			learned := rendezvousOnly(t)
			inSync := pp.eventsCaughtUp(t)
			const prefixes = 12
			agreed := 0
			for p := range prefixes {
				body := completionBody(fmt.Sprintf("new prefix %d round 0", p), 40)
				res, err := learned.ScheduleDeferred(context.Background(), pp.pool, &scheduling.Request{Model: "m", Prompt: promptOf(body)})
				if err != nil {
					t.Fatal(err)
				}
				want := res.Endpoints[0].Address
				res.Commit()
				pp.send(body)
				first := pp.picked
				if first == want {
					agreed++
				}
				// The prefix's next request, once the servers' events of the
				// first arrived, follows its blocks.
				poll.Until(t, 10*time.Second, "the servers' events received", inSync)
				pp.send(completionBody(fmt.Sprintf("new prefix %d round 1", p), 40))
				if pp.picked != first {
					t.Errorf("prefix %d: first on %s, then on %s", p, first, pp.picked)
				}
			}
			switch {
			case tc.rules != "false" && agreed != prefixes:
				t.Errorf("%d of %d new prefixes went to the rendezvous choice, want all", agreed, prefixes)
			case tc.rules == "false" && agreed == prefixes:
				t.Errorf("all %d new prefixes went to the rendezvous choice without affinityRules: the test does not tell the two apart", prefixes)
			}
		})
	}
}

// TestPreciseSpeculativeIndexing: with speculativeIndexing a pick's
// prompt blocks count on its endpoint before the server's events store
// them, so the prefix's next request, picked before its first is served,
// follows it; without, the events score every server 0 for it (the
// learned index's rules off) and the choice is the load scorers'
// tie-break. Not set, it is on. The picks are committed and never sent,
// so no event stores their blocks.
func TestPreciseSpeculativeIndexing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		speculative string
		ips         []string
	}{
		{"on", "\n    speculativeIndexing: true\n    speculativeTTL: 1m", []string{"127.0.101.2", "127.0.101.3", "127.0.101.4"}},
		{"off", "\n    speculativeIndexing: false", []string{"127.0.102.2", "127.0.102.3", "127.0.102.4"}},
		{"absent", "", []string{"127.0.105.2", "127.0.105.3", "127.0.105.4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := newPrecisePool(t, tc.ips, strings.Replace(affinityConfig, "affinityRules: %s", "affinityRules: false"+tc.speculative, 1))
			pp.followed(t)
			pick := func(body []byte) string {
				t.Helper()
				res, err := pp.sched.ScheduleDeferred(context.Background(), pp.pool, &scheduling.Request{Model: "m", Prompt: promptOf(body)})
				if err != nil {
					t.Fatal(err)
				}
				defer res.Commit()
				return res.Endpoints[0].Address
			}
			const prefixes = 12
			followed := 0
			for p := range prefixes {
				first := pick(completionBody(fmt.Sprintf("unsent prefix %d round 0", p), 40))
				if pick(completionBody(fmt.Sprintf("unsent prefix %d round 1", p), 40)) == first {
					followed++
				}
			}
			switch {
			case tc.name != "off" && followed != prefixes:
				t.Errorf("%d of %d prefixes' next requests followed their first, want all", followed, prefixes)
			case tc.name == "off" && followed == prefixes:
				t.Errorf("all %d prefixes' next requests followed their first without speculative indexing: the test does not tell the two apart", prefixes)
			}
		})
	}
}

// speculativeConfig is preciseConfig with speculativeIndexing, its blocks
// counted for a minute: longer than any test waits; unspeculativeConfig
// is preciseConfig without it.
var (
	speculativeConfig   = strings.Replace(preciseConfig, "      timeout: 1s\n", "      timeout: 1s\n    speculativeIndexing: true\n    speculativeTTL: 1m\n", 1)
	unspeculativeConfig = strings.Replace(preciseConfig, "      timeout: 1s\n", "      timeout: 1s\n    speculativeIndexing: false\n", 1)
)

// TestPreciseSpeculativeBalance: the cache balance of new prefixes
// (rendezvousBalanceCache) counts, with speculativeIndexing, the blocks
// each server is expected to store, so new prefixes placed before any of
// their events arrive are spread as if stored: eight whose rendezvous
// choice is one server end at most two prompts apart on three servers.
// Without it the events show nothing yet and all eight go to that server.
// The picks are committed and never sent.
func TestPreciseSpeculativeBalance(t *testing.T) {
	for _, tc := range []struct {
		name        string
		speculative bool
		ips         []string
	}{
		{"on", true, []string{"127.0.103.2", "127.0.103.3", "127.0.103.4"}},
		{"off", false, []string{"127.0.104.2", "127.0.104.3", "127.0.104.4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := speculativeConfig
			if !tc.speculative {
				config = unspeculativeConfig
			}
			pp := newPrecisePool(t, tc.ips, config)
			pp.followed(t)
			pick := func(sched *scheduling.Scheduler, prompt []byte) string {
				t.Helper()
				res, err := sched.ScheduleDeferred(context.Background(), pp.pool, &scheduling.Request{Model: "m", Prompt: prompt})
				if err != nil {
					t.Fatal(err)
				}
				defer res.Commit()
				return res.Endpoints[0].Address
			}
			// Eight new prefixes the rendezvous hash alone puts on one server.
			hashOnly := rendezvousOnly(t)
			var favoured string
			var prompts [][]byte
			for i := 0; len(prompts) < 8; i++ {
				prompt := promptOf(completionBody(fmt.Sprintf("balanced prefix %d round 0", i), 40))
				choice := pick(hashOnly, prompt)
				if favoured == "" {
					favoured = choice
				}
				if choice == favoured {
					prompts = append(prompts, prompt)
				}
			}
			counts := map[string]int{}
			for _, prompt := range prompts {
				counts[pick(pp.sched, prompt)]++
			}
			least := len(prompts)
			for _, ip := range tc.ips {
				least = min(least, counts[ip+":"+strings.Split(favoured, ":")[1]])
			}
			switch {
			case tc.speculative && counts[favoured]-least > 2:
				t.Errorf("placed %v: the favoured server %s holds more than two prompts beyond the least", counts, favoured)
			case !tc.speculative && counts[favoured] != len(prompts):
				t.Errorf("placed %v without speculative indexing, want all on %s", counts, favoured)
			}
		})
	}
}

// TestPreciseWeighsInLearnedUnits: with affinityRules the events' matches
// are weighed against load in the learned index's units, its estimate of
// the tokens, so that queueCostTokens moves a prefix at the load the
// approximate scorer moves it even where the servers count twice as many
// bytes a token as the estimate. One server holds the whole prefix (320
// of the servers' tokens, 640 of the estimate's), the other its first
// half; the holder's one request of extra load costs queueCostTokens (240).
// In the estimate's units the whole holder keeps the prompt at that load
// (640 - 240 against 320) and gives it up at twice it; in the servers'
// it would give it up at once (320 - 240 against 160).
func TestPreciseWeighsInLearnedUnits(t *testing.T) {
	const config = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 16
      hashSeed: "42"
    kvEventsConfig:
      podDiscoveryConfig:
        socketPort: %d
        replaySocketPort: %d
    tokenizer:
      timeout: 1s
    approximate:
      queueCostTokens: 240
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  - pluginRef: max-score-picker
`
	ps := newPreciseServersTokenizing(t, []string{"127.0.96.2", "127.0.96.3"}, 8)
	pp := newPrecisePicker(t, ps, config, nil)
	pp.followed(t)
	whole, half := ps.sims[0], ps.sims[1]
	inSync := pp.eventsCaughtUp(t)
	postTo(t, whole, completionBody("shared round 0", 40))
	postTo(t, half, completionBody("shared round 0", 20))
	poll.Until(t, 10*time.Second, "the servers' events received", inSync)
	prompt := promptOf(completionBody("shared round 1", 40))
	for _, tc := range []struct {
		extraLoad int
		want      *modelsim.Server
	}{
		{0, whole},
		{1, whole},
		{2, half},
	} {
		t.Run(fmt.Sprintf("extra load %d", tc.extraLoad), func(t *testing.T) {
			for _, e := range pp.pool.Endpoints().Endpoints {
				m := &datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)}
				if e.Address == whole.Addr() {
					m.WaitingRequests = tc.extraLoad
				}
				e.SetMetrics(m)
			}
			res, err := pp.sched.ScheduleDeferred(context.Background(), pp.pool, &scheduling.Request{Model: "m", Prompt: prompt})
			if err != nil {
				t.Fatal(err)
			}
			got := res.Endpoints[0].Address
			res.Commit()
			if got != tc.want.Addr() {
				t.Errorf("picked %s, want %s", got, tc.want.Addr())
			}
		})
	}
}

// rendezvousOnly is a scheduler of the learned index alone with the
// rendezvous parameters of the precise configs' learned index, and no
// knowledge of any pool: its pick for a new prompt is the rendezvous choice
// every replica makes (without the cache balance).
func rendezvousOnly(t testing.TB) *scheduling.Scheduler {
	t.Helper()
	s, err := scheduling.New(nil, scheduling.Options{ConfigText: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    rendezvousBlocks: 4
    rendezvousLoadSlack: 8
- type: max-score-picker
`})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fill posts s four prompts of 40 blocks, which fill its 160: the prefix
// it cached before them is evicted.
func fill(t testing.TB, s *modelsim.Server) {
	t.Helper()
	for i := range 4 {
		postTo(t, s, completionBody(fmt.Sprintf("filler %d round 0", i), 40))
	}
}

// TestPreciseEvictedAfterPick: when the blocks a pick found are evicted
// before the server runs the request (other prompts fill its cache while
// the request is on its way), the server reports fewer cached tokens than
// predicted, and the events tell that the index was right at the pick:
// the shortfall is counted as evicted after it. When nothing is evicted,
// nothing is counted.
func TestPreciseEvictedAfterPick(t *testing.T) {
	ps := newPreciseServers(t, []string{"127.0.97.2"})
	pp := newPrecisePicker(t, ps, preciseConfig, nil)
	pp.followed(t)
	sim := ps.sims[0]
	inSync := pp.eventsCaughtUp(t)
	labels := map[string]string{"plugin": "precise-prefix-cache-scorer"}
	counters := func() (predicted, confirmed, evicted float64) {
		return promtest.Value(pp.prom, prefix.MetricPredictedTokens, labels), promtest.Value(pp.prom, prefix.MetricConfirmedTokens, labels),
			promtest.Value(pp.prom, prefix.MetricEvictedAfterPick, labels)
	}
	evict := func(string) {
		fill(t, sim)
		poll.Until(t, 10*time.Second, "the server's events received", inSync)
	}
	pp.send(completionBody("held round 0", 40))
	poll.Until(t, 10*time.Second, "the server's events received", inSync)
	for round, tc := range []struct {
		name       string
		forwarding func(string)
		evicted    bool
	}{
		{"kept", nil, false},
		{"evicted while on its way", evict, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p0, c0, e0 := counters()
			pp.forwarding = tc.forwarding
			defer func() { pp.forwarding = nil }()
			pp.send(completionBody(fmt.Sprintf("held round %d", round+1), 40))
			poll.Until(t, 10*time.Second, "the server's events received", inSync)
			p1, c1, e1 := counters()
			predicted, confirmed, evicted := p1-p0, c1-c0, e1-e0
			if predicted < 39*16 {
				t.Fatalf("predicted %v cached tokens of a 40-block prefix the server held at the pick", predicted)
			}
			switch {
			case !tc.evicted && (confirmed != predicted || evicted != 0):
				t.Errorf("nothing evicted: confirmed %v of %v, %v counted evicted after the pick; want all, 0", confirmed, predicted, evicted)
			case tc.evicted && (confirmed == predicted || evicted != predicted-confirmed):
				t.Errorf("prefix evicted after the pick: confirmed %v of %v, %v counted evicted after it; want the shortfall", confirmed, predicted, evicted)
			}
		})
	}
}

// TestPreciseEvictedPrefixReturns: with affinityRules, a prefix that its
// server evicted goes back to that server from every replica, though none
// of them sent it there: the servers' events, which every replica reads
// alike, tell where it was. Two pickers of the same servers without peer
// sync are the replicas; the prefix is put on a server other than the
// rendezvous choice (where a replica that never saw it would send it
// otherwise) by posting it there directly, then evicted there by four
// prompts that fill the server's 160 blocks.
func TestPreciseEvictedPrefixReturns(t *testing.T) {
	ps := newPreciseServers(t, []string{"127.0.98.2", "127.0.98.3", "127.0.98.4"})
	config := strings.Replace(affinityConfig, "affinityRules: %s", "affinityRules: true", 1)
	replicas := []*precisePool{newPrecisePicker(t, ps, config, nil), newPrecisePicker(t, ps, config, nil)}
	for _, pp := range replicas {
		pp.followed(t)
	}
	inSync := []func() bool{replicas[0].eventsCaughtUp(t), replicas[1].eventsCaughtUp(t)}
	awaitEvents := func() {
		t.Helper()
		poll.Until(t, 10*time.Second, "the servers' events received by both replicas", func() bool {
			return inSync[0]() && inSync[1]()
		})
	}
	next := completionBody("evicted round 1", 40)
	holder := offRendezvous(t, ps, replicas[0].pool, promptOf(next))
	postTo(t, holder, completionBody("evicted round 0", 40))
	awaitEvents()
	fill(t, holder)
	awaitEvents()
	for i, pp := range replicas {
		if got := pickedBy(t, pp.sched, pp.pool, promptOf(next)); got != holder.Addr() {
			t.Errorf("replica %d sent the evicted prefix to %s, want %s, where it was (not the rendezvous choice)", i, got, holder.Addr())
		}
	}
	// The server had evicted it: the pick was not of blocks it held.
	before := holder.Stats().CachedPromptTokens
	replicas[0].send(next)
	if cached := holder.Stats().CachedPromptTokens - before; replicas[0].picked == holder.Addr() && cached != 0 {
		t.Errorf("%s still held %d tokens of the prefix: it was not evicted", holder.Addr(), cached)
	}
}

// TestPreciseBalancesByEvents: the learned index keeps a new prefix off a
// server holding more than a prompt's blocks beyond the least held
// (rendezvousBalanceCache, on in the default learned-index parameters an
// llm-d precise config gets), counting what the servers' events say they
// hold, as every replica does alike, not its own picks: two replicas that
// never picked for the full server both keep the prefix off it and agree
// where it goes. The events' blocks are counted in the learned index's
// estimate of tokens: where the servers count 8 bytes a token, 30 of their
// blocks are 60 of the estimate's (of 4 bytes), beyond the prompt's 40.
func TestPreciseBalancesByEvents(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ips           []string
		bytesPerToken int
		fill          []int // the prompts' blocks (64 bytes each) put on the full server
	}{
		{"as the estimate counts", []string{"127.0.99.2", "127.0.99.3", "127.0.99.4"}, 4, []int{40, 40}},
		{"twice the estimate's bytes a token", []string{"127.0.100.2", "127.0.100.3", "127.0.100.4"}, 8, []int{60}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPreciseServersTokenizing(t, tc.ips, tc.bytesPerToken)
			replicas := []*precisePool{newPrecisePicker(t, ps, preciseConfig, nil), newPrecisePicker(t, ps, preciseConfig, nil)}
			inSync := make([]func() bool, len(replicas))
			for i, pp := range replicas {
				pp.followed(t)
				inSync[i] = pp.eventsCaughtUp(t)
			}
			hashOnly := rendezvousOnly(t)
			prompt := promptOf(completionBody("new prefix round 0", 40))
			res, err := hashOnly.ScheduleDeferred(context.Background(), replicas[0].pool, &scheduling.Request{Model: "m", Prompt: prompt})
			if err != nil {
				t.Fatal(err)
			}
			full := res.Endpoints[0].Address
			res.Commit()
			for _, s := range ps.sims {
				if s.Addr() == full {
					for i, blocks := range tc.fill {
						postTo(t, s, completionBody(fmt.Sprintf("filler %d round 0", i), blocks))
					}
				}
			}
			poll.Until(t, 10*time.Second, "the servers' events received by both replicas", func() bool { return inSync[0]() && inSync[1]() })
			var picked []string
			for _, pp := range replicas {
				res, err := pp.sched.ScheduleDeferred(context.Background(), pp.pool, &scheduling.Request{Model: "m", Prompt: prompt})
				if err != nil {
					t.Fatal(err)
				}
				picked = append(picked, res.Endpoints[0].Address)
				res.Commit()
			}
			if picked[0] == full || picked[1] == full {
				t.Errorf("replicas picked %v for a new prefix: the full server %s too", picked, full)
			}
			if picked[0] != picked[1] {
				t.Errorf("replicas placed the new prefix differently: %v", picked)
			}
		})
	}
}

// TestPreciseEventsOverLearnedBelief: a prefix the learned index last
// sent to a server that has since evicted it, and whose removal the events
// no longer remember, is placed as a new prefix (the rendezvous choice,
// which passes over the server holding a full cache), not sent back to
// where the learned index believes it is: the events are newer than the
// belief.
func TestPreciseEventsOverLearnedBelief(t *testing.T) {
	ps, pp, inSync := followedPrecise(t, []string{"127.0.106.2", "127.0.106.3", "127.0.106.4"})
	body := completionBody("forgotten round 0", 40)
	pp.send(body)
	believed := pp.picked
	poll.Until(t, 10*time.Second, "the servers' events received", inSync)
	// Three caches' worth of other prompts: the first evicts the prefix,
	// the next two push its removal out of the events' record of removed
	// blocks, which keeps as many as the server held at most.
	for _, s := range ps.sims {
		if s.Addr() == believed {
			for i := range 12 {
				postTo(t, s, completionBody(fmt.Sprintf("filler %d round 0", i), 40))
			}
		}
	}
	poll.Until(t, 10*time.Second, "the servers' events received", inSync)
	if got := pickedBy(t, pp.sched, pp.pool, promptOf(body)); got == believed {
		t.Errorf("the prefix went back to %s, where the learned index last sent it and the server evicted it", got)
	}
}

// TestPreciseEvictedPrefixSparesAFullServer: an evicted prefix goes back
// to the server that removed it (TestPreciseEvictedPrefixReturns) only
// while that server has a free sequence; with a request in flight there
// and none elsewhere (these servers were never seen running more than
// one), the prompt, a miss wherever it goes, is placed as a prefix held
// nowhere instead (rendezvousNeedsRoom, on in the default learned-index
// parameters), not queued behind the full batch. Mutation-checked: without
// the rule it goes back to the full server.
func TestPreciseEvictedPrefixSparesAFullServer(t *testing.T) {
	ps, pp, inSync := followedPrecise(t, []string{"127.0.107.2", "127.0.107.3", "127.0.107.4"})
	next := completionBody("evicted round 1", 40)
	holder := offRendezvous(t, ps, pp.pool, promptOf(next))
	postTo(t, holder, completionBody("evicted round 0", 40))
	poll.Until(t, 10*time.Second, "the servers' events received", inSync)
	fill(t, holder)
	poll.Until(t, 10*time.Second, "the servers' events received", inSync)
	e, ok := pp.pool.Endpoints().Get(holder.Addr())
	if !ok {
		t.Fatalf("%s is not in the pool", holder.Addr())
	}
	lease := pp.pool.Acquire(e)
	defer lease.Release()
	if got := pickedBy(t, pp.sched, pp.pool, promptOf(next)); got == holder.Addr() {
		t.Errorf("the evicted prefix went back to %s with its batch full and the other servers free", got)
	}
}

// pickedBy is the endpoint sched picks for prompt in pool, its pick
// committed (and never sent).
func pickedBy(t testing.TB, sched *scheduling.Scheduler, pool *datastore.Pool, prompt []byte) string {
	t.Helper()
	res, err := sched.ScheduleDeferred(context.Background(), pool, &scheduling.Request{Model: "m", Prompt: prompt})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Commit()
	return res.Endpoints[0].Address
}

// offRendezvous is a server of ps other than the rendezvous choice for
// prompt in pool.
func offRendezvous(t testing.TB, ps *preciseServers, pool *datastore.Pool, prompt []byte) *modelsim.Server {
	t.Helper()
	rendezvous := pickedBy(t, rendezvousOnly(t), pool, prompt)
	for _, s := range ps.sims {
		if s.Addr() != rendezvous {
			return s
		}
	}
	t.Fatalf("every server is the rendezvous choice %s", rendezvous)
	return nil
}

// followedPrecise is a picker of preciseConfig over servers on ips, their
// events followed, and the test of its having caught up with them
// (eventsCaughtUp).
func followedPrecise(t testing.TB, ips []string) (*preciseServers, *precisePool, func() bool) {
	t.Helper()
	ps := newPreciseServers(t, ips)
	pp := newPrecisePicker(t, ps, preciseConfig, nil)
	pp.followed(t)
	return ps, pp, pp.eventsCaughtUp(t)
}
