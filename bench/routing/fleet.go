// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/kvevents"
	"github.com/poolpicker/poolpicker/peersync"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/plugins/prefix"
	"github.com/poolpicker/poolpicker/scrape"
)

// Objectives of the pool: requests name one in x-gateway-inference-objective.
const (
	objectiveCritical  = "interactive" // priority 0
	objectiveSheddable = "batch"       // priority -1: refused (429) when the pool is saturated
	pickerService      = "epp"
	pickerPort         = 9002
)

// fleet is one router's whole stack: model servers on their own loopback
// IPs and the poolpicker replicas in front of them. Each replica is what a
// separate poolpicker process has: its own registry with one pool of the
// servers, its own scraper, its own scheduler (and prefix index) built from
// the router's config, and its own real ext_proc server on a socket. The
// client talks to them over gRPC as a gateway does, spreading its streams
// over the replicas (spread).
type fleet struct {
	servers  []modelServer
	replicas []*replica
	spread   spreadMode
	next     atomic.Uint64 // round robin's turn
	rand     func() uint64 // random spread's source
	http     *http.Client
	stop     func()
	// kv relays the servers' KV-cache events to a picker that reads them
	// (nil: they go nowhere); renderAddr is the first server's own
	// address, where such a picker renders prompts into tokens.
	kv         *kvRelay
	renderAddr string
}

// replica is one poolpicker replica of a fleet (or the reference EPP,
// whose scheduler is not reachable: sched and metrics nil).
type replica struct {
	sched *scheduling.Scheduler
	// metrics holds the scheduler's plugin metrics (the prefix index's
	// predictions against the servers' reports).
	metrics *prometheus.Registry
	// client dials the replica with authority, the :authority its pool's
	// gateway uses.
	client    *eppclient.Client
	authority string
}

// spreadMode is how the client spreads streams over the replicas.
type spreadMode string

const (
	// spreadRoundRobin takes the replicas in turn, as a gateway's round
	// robin over the picker Service's endpoints does.
	spreadRoundRobin spreadMode = "round-robin"
	// spreadRandom takes a replica at random per stream (Envoy's random
	// load balancing, or least-request among equally busy hosts).
	spreadRandom spreadMode = "random"
)

// nextReplica is the replica the next stream goes to.
func (f *fleet) nextReplica() *replica {
	n := uint64(len(f.replicas))
	if n == 1 {
		return f.replicas[0]
	}
	if f.spread == spreadRandom {
		return f.replicas[f.rand()%n]
	}
	return f.replicas[(f.next.Add(1)-1)%n]
}

// startFleet starts fleet number n (its servers on 127.0.(20+n).2, .3, ...)
// with the given number of poolpicker replicas.
func startFleet(ctx context.Context, n int, cfg *sweepConfig, r router, replicas int) (_ *fleet, err error) {
	f := &fleet{spread: cfg.spread, rand: seeded(cfg.seed + 200)}
	var stops []func()
	f.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()

	lns, port, err := listenSamePort(n, cfg.servers)
	if err != nil {
		return nil, err
	}
	kvEndpoint := ""
	if (r.external != nil && r.external.kvEvents) || (r.external == nil && r.kvEvents) {
		if cfg.sim != simLLMD {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, fmt.Errorf("router %s reads the servers' KV-cache events: it needs -sim %s", r.name, simLLMD)
		}
		pickers := replicas
		if r.external != nil {
			pickers = 1
		}
		if f.kv, err = startKVRelay(ctx, port, pickers); err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, err
		}
		stops = append(stops, f.kv.stop)
		kvEndpoint = f.kv.serverEndpoint
		// Each server's replay socket on its pod's IP, one port for all
		// as the pickers find it.
		replay, replayPort, err := listenSamePort(n, cfg.servers)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, err
		}
		for _, ln := range replay {
			ln.Close()
		}
		f.kv.replayPort = replayPort
	}
	var pods []datastore.EndpointSource
	for i, ln := range lns {
		name := fmt.Sprintf("server-%d", i)
		var s modelServer
		if cfg.sim == simLLMD {
			replayEndpoint := ""
			if f.kv != nil {
				ip, _, _ := net.SplitHostPort(ln.Addr().String())
				replayEndpoint = fmt.Sprintf("tcp://%s:%d", ip, f.kv.replayPort)
			}
			ls, err := startLLMD(ctx, cfg.llmdBin, cfg, i, ln, name, cfg.seed+uint64(i), kvEndpoint, replayEndpoint)
			if err != nil {
				for _, ln := range lns[i+1:] {
					ln.Close()
				}
				return nil, err
			}
			s = ls
			if i == 0 {
				f.renderAddr = ls.target
			}
		} else {
			ms, err := modelsim.New(modelsim.Options{
				Listener:            ln,
				MaxNumSeqs:          cfg.slotsOf(i),
				BlockSizeTokens:     cfg.blockTokens,
				PromptBytesPerToken: cfg.promptBytesPerToken,
				NumGPUBlocks:        cfg.kvBlocksOf(i),
				LoRAAdapters:        cfg.adapters(),
				MaxLoRAs:            cfg.maxLoRAs,
				PrefillOverhead:     cfg.prefillOverhead,
				PrefillPerToken:     cfg.prefillPerToken,
				DecodePerToken:      cfg.decodePerToken,
				LoadSlowdown:        cfg.loadSlowdown,
				TimeScale:           cfg.timeScale,
				Seed:                cfg.seed + uint64(i),
				MetricsPageBytes:    -1,
				Name:                name,
			})
			if err != nil {
				for _, ln := range lns[i:] {
					ln.Close()
				}
				return nil, err
			}
			if err := ms.Start(ctx); err != nil {
				return nil, err
			}
			s = simServer{ms}
		}
		stops = append(stops, s.Stop)
		f.servers = append(f.servers, s)
		ip, _, _ := net.SplitHostPort(ln.Addr().String())
		pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("server-%d", i)},
			UID: types.UID(fmt.Sprintf("uid-%d-%d", n, i)), IP: ip})
	}

	if r.external != nil {
		rp, stop, err := startReference(ctx, n, cfg, r.external, f, port, pods)
		if err != nil {
			return nil, err
		}
		stops = append(stops, stop)
		f.replicas = append(f.replicas, rp)
	}
	var links []*peerLink
	if r.peerSync && r.external == nil {
		if links, err = peerLinks(replicas, cfg.seed+uint64(n)); err != nil {
			return nil, err
		}
	}
	for i := 0; i < replicas && r.external == nil; i++ {
		var link *peerLink
		if links != nil {
			link = links[i]
		}
		config := r.config
		if r.kvEvents {
			if config, err = withKVEvents(config, f.kv.eppEndpoints[i], f.kv.replayPort); err != nil {
				return nil, err
			}
		}
		rp, stop, err := startReplica(ctx, n, i, cfg, config, r.flowControl, r.admission, port, pods, link)
		if err != nil {
			return nil, err
		}
		stops = append(stops, stop)
		f.replicas = append(f.replicas, rp)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	f.http = &http.Client{Transport: tr}
	stops = append(stops, tr.CloseIdleConnections)

	return f, nil
}

// startReplica starts replica r of fleet n in front of the fleet's pods, and
// returns it once it has scraped every server (a cold start is not what
// the sweep measures) with the function that stops it.
func startReplica(ctx context.Context, n, r int, cfg *sweepConfig, schedConfig string, flowControl bool, admission string, port int, pods []datastore.EndpointSource, link *peerLink) (_ *replica, _ func(), err error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	metrics := prometheus.NewRegistry()
	// The plugins' goroutines (a precise scorer's KV-event subscriptions)
	// end with the replica.
	pctx, pcancel := context.WithCancel(ctx)
	stops = append(stops, pcancel)
	so := scheduling.Options{ConfigText: schedConfig, Rand: seeded(cfg.seed + 100 + uint64(r)), Registry: upstreamRegistry(), Registerer: metrics, SaturationAdmission: admission,
		BaseContext: func() context.Context { return pctx }}
	if flowControl {
		so.QueueDepthThreshold = flowQueueDepth
	}
	reg := datastore.NewRegistry()
	var sched *scheduling.Scheduler
	var exchange *peersync.Exchange
	if link != nil {
		exchange, err = peersync.New(peersync.Options{Registry: reg, HashKey: link.key, Secret: link.secret, Registerer: metrics, Listener: link.lis, Peers: link.peers,
			Learner: peersync.LearnerFuncs{
				Learn: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
					sched.LearnPeerBlocks(pool, e, blocks)
				},
				Forget: func(pool *datastore.Pool, e *datastore.Endpoint, blocks []uint64) {
					sched.ForgetPeerBlocks(pool, e, blocks)
				},
			}})
		if err != nil {
			link.lis.Close()
			return nil, nil, err
		}
		so.Peers = exchange
	}
	sched, err = scheduling.New(nil, so)
	if err != nil {
		return nil, nil, err
	}
	fc, err := newFlowControl(flowControl, sched)
	if err != nil {
		return nil, nil, err
	}
	// Every server every interval, as a busy fleet is scraped.
	sco := scrape.Options{RefreshInterval: scaled(cfg.scrapeInterval, cfg.timeScale), IdleRefreshInterval: -1}
	if fc != nil {
		sco.Published = fc.Wake
	}
	scraper, err := scrape.NewManager(sco)
	if err != nil {
		return nil, nil, err
	}
	rp := &replica{sched: sched, metrics: metrics}
	reg.AddObserver(sched)
	reg.AddObserver(scraper)
	if fc != nil {
		reg.AddObserver(fc)
	}
	pool := reg.Upsert(types.NamespacedName{Namespace: "bench", Name: "pool"}, &datastore.PoolSpec{
		Selector: map[string]string{"app": "bench"}, TargetPorts: []int32{int32(port)}, PickerService: pickerService, PickerPort: pickerPort})
	pool.SetPolicy(&datastore.Policy{Objectives: map[string]int{objectiveCritical: 0, objectiveSheddable: -1, objectiveFlowA: 0, objectiveFlowB: 0}})
	pool.SetPods(pods)
	pool.SetSynced(true)

	sctx, cancel := context.WithCancel(ctx)
	scraped := make(chan struct{})
	go func() { _ = scraper.Start(sctx); close(scraped) }()
	stops = append(stops, func() { cancel(); <-scraped })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		return nil, nil, err
	}
	eo := extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis, FlowControl: fc}
	if exchange != nil {
		reg.AddLoadObserver(exchange)
		xctx, xcancel := context.WithCancel(ctx)
		synced := make(chan struct{})
		go func() { _ = exchange.Start(xctx); close(synced) }()
		stops = append(stops, func() { xcancel(); <-synced })
	}
	srv, err := extproc.New(reg, sched, eo)
	if err != nil {
		lis.Close()
		hlis.Close()
		return nil, nil, err
	}
	ectx, ecancel := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { _ = srv.Start(ectx); close(served) }()
	stops = append(stops, func() { ecancel(); <-served })

	rp.client, rp.authority = eppclient.New(lis.Addr().String(), eppclient.Options{}), fmt.Sprintf("%s.bench.svc:%d", pickerService, pickerPort)
	stops = append(stops, func() { _ = rp.client.Close() })

	// The pool is in demand meanwhile (NoteRequest), so a scrape that
	// failed on a starved machine is retried at once rather than after
	// the idle interval.
	deadline := time.Now().Add(30 * time.Second)
	for _, e := range pool.Endpoints().Endpoints {
		for e.Metrics() == nil {
			pool.NoteRequest(time.Now())
			if time.Now().After(deadline) {
				return nil, nil, fmt.Errorf("fleet %d replica %d: %s never scraped", n, r, e.Address)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return rp, stop, nil
}

// peerLink is one replica's part in its fleet's peer sync: its listener,
// its peers' addresses, and the fleet's hash key.
type peerLink struct {
	lis   net.Listener
	peers func() []string
	key   uint64
	// secret authenticates the replicas to each other.
	secret []byte
}

// peerLinks binds a peer-sync listener per replica on loopback; each
// replica's peers are the others'.
func peerLinks(replicas int, seed uint64) ([]*peerLink, error) {
	links := make([]*peerLink, replicas)
	addrs := make([]string, replicas)
	key := seeded(seed + 300)()
	secret := []byte(fmt.Sprintf("bench peer-sync secret %d", seed))
	for i := range links {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range links[:i] {
				l.lis.Close()
			}
			return nil, err
		}
		addrs[i] = lis.Addr().String()
		links[i] = &peerLink{lis: lis, key: key, secret: secret}
	}
	for i, l := range links {
		others := slices.Delete(slices.Clone(addrs), i, i+1)
		l.peers = func() []string { return others }
	}
	return links, nil
}

// queueStats are a run's server queues (running + waiting) over time.
type queueStats struct{ spread, total float64 }

// sampleQueues reads every server's queue each interval until ctx ends, and
// then sends the means over the samples.
func (f *fleet) sampleQueues(ctx context.Context, interval time.Duration) <-chan queueStats {
	out := make(chan queueStats, 1)
	go func() {
		var spread, total float64
		var n int
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				if n > 0 {
					spread, total = spread/float64(n), total/float64(n)
				}
				out <- queueStats{spread, total}
				return
			case <-t.C:
			}
			least, most, sum := math.MaxInt, 0, 0
			for _, s := range f.servers {
				q := s.queue()
				least, most, sum = min(least, q), max(most, q), sum+q
			}
			spread += float64(most - least)
			total += float64(sum)
			n++
		}
	}()
	return out
}

// agreement is the prefix index's predicted cached tokens against what the
// servers reported, summed over the replicas: the prefix-cache scorer's
// prediction metrics.
func (f *fleet) agreement() (predicted, confirmed, over, observed int64) {
	for _, r := range f.replicas {
		if r.metrics == nil {
			continue
		}
		a := gatherCounters(r.metrics)
		predicted += a[prefix.MetricPredictedTokens]
		confirmed += a[prefix.MetricConfirmedTokens]
		over += a[prefix.MetricOverPredictions]
		observed += a[prefix.MetricPredictions]
	}
	return predicted, confirmed, over, observed
}

// eventAgreement is, summed over the replicas, the predicted and confirmed
// cached tokens of the precise scorers' event indexes alone (a precise
// scorer's learned index reports under its name with "-approximate"), of
// the rest those the servers evicted after the pick, and the picks they
// scored from the learned index for want of tokens.
func (f *fleet) eventAgreement() (predicted, confirmed, evicted, fallbacks int64) {
	for _, r := range f.replicas {
		if r.metrics == nil {
			continue
		}
		byPlugin := gatherByPlugin(r.metrics)
		for plugin, a := range byPlugin {
			if _, precise := byPlugin[plugin+"-approximate"]; precise {
				predicted += a[prefix.MetricPredictedTokens]
				confirmed += a[prefix.MetricConfirmedTokens]
				evicted += a[prefix.MetricEvictedAfterPick]
			}
		}
		fallbacks += gatherCounters(r.metrics)[prefix.MetricTokenizeFallbacks]
	}
	return predicted, confirmed, evicted, fallbacks
}

// kvEventsSummary is, per replica whose scheduler reads KV events, its
// event subscriptions' record: messages received, gaps, replays (ok and
// failed), resyncs and the endpoints unconfirmed at the end, and with peer
// sync the block and in-flight records it received from its peers ("" when
// none reads events).
func (f *fleet) kvEventsSummary() string {
	var parts []string
	for i, r := range f.replicas {
		if r.metrics == nil {
			continue
		}
		mfs, err := r.metrics.Gather()
		if err != nil {
			continue
		}
		v := map[string]float64{}
		found, peers := false, false
		for _, mf := range mfs {
			name := mf.GetName()
			for _, m := range mf.GetMetric() {
				switch {
				case name == kvevents.MetricReplays || name == peersync.MetricReceived:
					for _, l := range m.GetLabel() {
						if l.GetName() == "result" || l.GetName() == "kind" {
							v[name+"/"+l.GetValue()] += m.GetCounter().GetValue()
						}
					}
					peers = peers || name == peersync.MetricReceived
				case m.GetCounter() != nil:
					v[name] += m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					v[name] += m.GetGauge().GetValue()
				}
				found = found || name == kvevents.MetricLLMDActive
			}
		}
		if !found {
			continue
		}
		part := fmt.Sprintf("replica %d: %.0f messages, %.0f gaps, replays %.0f ok %.0f failed, %.0f resyncs, %.0f unconfirmed", i,
			v[kvevents.MetricLLMDMessages], v[kvevents.MetricGaps], v[kvevents.MetricReplays+"/ok"], v[kvevents.MetricReplays+"/failed"],
			v[kvevents.MetricResyncs], v[kvevents.MetricUnconfirmed])
		if peers {
			part += fmt.Sprintf(", peer sync received %.0f block and %.0f in-flight records", v[peersync.MetricReceived+"/blocks"], v[peersync.MetricReceived+"/in-flight"])
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

// gatherByPlugin sums each counter of g by its "plugin" label.
func gatherByPlugin(g prometheus.Gatherer) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			c := m.GetCounter()
			if c == nil {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "plugin" {
					if out[l.GetValue()] == nil {
						out[l.GetValue()] = map[string]int64{}
					}
					out[l.GetValue()][mf.GetName()] += int64(c.GetValue())
				}
			}
		}
	}
	return out
}

// gatherCounters sums each counter of g over its series.
func gatherCounters(g prometheus.Gatherer) map[string]int64 {
	out := map[string]int64{}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				out[mf.GetName()] += int64(c.GetValue())
			}
		}
	}
	return out
}

// listenSamePort binds count listeners on 127.0.(20+n).2, .3, ... sharing one
// port, as the pods of a pool share their target port.
func listenSamePort(n, count int) ([]net.Listener, int, error) {
	for attempt := 0; attempt < 20; attempt++ {
		first, err := net.Listen("tcp", fmt.Sprintf("127.0.%d.2:0", 20+n))
		if err != nil {
			return nil, 0, err
		}
		port := first.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{first}
		for i := 1; i < count; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.%d.%d:%d", 20+n, i+2, port))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) == count {
			return lns, port, nil
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	return nil, 0, fmt.Errorf("no port free on all of 127.0.%d.2-%d", 20+n, count+1)
}

func scaled(d time.Duration, scale float64) time.Duration {
	return max(time.Duration(float64(d)/scale), time.Millisecond)
}

// outcome is what the client saw of one request, in wall time.
type outcome struct {
	status       int // 200, or the ext_proc ImmediateResponse's status
	ttft, e2e    time.Duration
	decided      time.Time // when the picker's answer came
	promptTokens int
	cachedTokens int
	done         time.Time
	server       string // the endpoint that served it
}

// send runs one request as a gateway with the ext_proc filter in
// FULL_DUPLEX_STREAMED mode does: headers and body to the picker, the
// request to the endpoint it names, then the response back through the
// stream as it comes (so poolpicker sees its first token, its end and its
// usage). start is the
// request's arrival, from which TTFT and end-to-end time count.
func (f *fleet) send(ctx context.Context, start time.Time, id string, objective string, body []byte) (outcome, error) {
	var out outcome
	rp := f.nextReplica()
	req := eppclient.Request{Shape: eppclient.FullDuplex, Authority: rp.authority, Body: body, Headers: []eppclient.Header{
		{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
		{Key: ":authority", Value: "gateway.bench"}, {Key: "content-type", Value: "application/json"},
		{Key: "content-length", Value: strconv.Itoa(len(body))}, {Key: "x-request-id", Value: id},
		{Key: "x-gateway-inference-objective", Value: objective}}}
	// The request goes to the endpoint the picker named, and its response
	// back through the stream (so poolpicker sees it finish and reads its
	// usage), as the gateway sends it.
	req.Forward = func(ctx context.Context, res *eppclient.Result) (*eppclient.Response, error) {
		dest := res.Endpoints()[0]
		out.server = dest
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+dest+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		hreq.Header.Set("content-type", "application/json")
		resp, err := f.http.Do(hreq)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return nil, fmt.Errorf("request %s: %s answered %d: %s", id, dest, resp.StatusCode, b)
		}
		// The body goes back through the stream as it comes, as the
		// gateway streams it.
		return &eppclient.Response{Status: http.StatusOK, Headers: []eppclient.Header{{Key: "content-type", Value: "text/event-stream"}},
			Stream: &sseBody{body: resp.Body, id: id, start: start, out: &out}}, nil
	}
	opened := time.Now()
	res, err := rp.client.Do(ctx, req)
	if err != nil {
		return out, err
	}
	out.decided = opened.Add(res.Decided)
	if ir := res.Immediate; ir != nil {
		out.status = int(ir.GetStatus().GetCode())
		out.done = time.Now()
		return out, nil
	}
	if res.Destination == "" {
		return out, fmt.Errorf("request %s: no destination in %+v", id, res)
	}
	return out, nil
}

// sseBody is a completion's event stream as the gateway reads it from
// the server: it notes the request's TTFT when the first event comes,
// and at its end its end-to-end time and the usage event's tokens.
type sseBody struct {
	body  io.ReadCloser
	id    string
	start time.Time
	out   *outcome
	all   bytes.Buffer
}

func (b *sseBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.all.Write(p[:n])
	if b.out.ttft == 0 && bytes.Contains(b.all.Bytes(), []byte("data: {")) {
		b.out.ttft = time.Since(b.start)
	}
	if errors.Is(err, io.EOF) {
		b.out.e2e = time.Since(b.start)
		b.out.done = time.Now()
		b.out.status = http.StatusOK
		var uerr error
		if b.out.promptTokens, b.out.cachedTokens, uerr = usageOf(b.all.Bytes()); uerr != nil {
			return n, fmt.Errorf("request %s: %w", b.id, uerr)
		}
	}
	return n, err
}

func (b *sseBody) Close() error { return b.body.Close() }

// usageOf reads the usage event of an SSE completion stream.
func usageOf(sse []byte) (prompt, cached int, err error) {
	for _, line := range bytes.Split(sse, []byte("\n")) {
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		var ev struct {
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal(data, &ev) != nil || ev.Usage == nil {
			continue
		}
		if ev.Usage.PromptTokensDetails != nil {
			cached = ev.Usage.PromptTokensDetails.CachedTokens
		}
		return ev.Usage.PromptTokens, cached, nil
	}
	return 0, 0, errors.New("no usage in the response stream")
}
