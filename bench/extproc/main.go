// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command extproc-bench measures poolpicker's ext_proc round trip (request
// headers + body in, destination out) against a no-op ext_proc server that
// answers a fixed endpoint, in the same run, over real gRPC on loopback.
//
//	go -C bench run ./extproc -requests 20000
//
// The servers take turns in blocks of round trips (-rounds), so a change in
// the machine's speed during the run falls on all of them alike. For each
// body size and concurrency it prints req/s, p50/p99 latency to
// the destination answer, process CPU per request (client and server share
// the process, so the difference between rows is the server's extra cost),
// and the latency ratio to the no-op server.
//
// Request body readers on JSON libraries are compared with requestbody's
// scanner by bench/bodyreader's BenchmarkReaders, reader against reader.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/scheduling"
)

func main() { os.Exit(mainCode()) }

func mainCode() int {
	requests := flag.Int("requests", 20000, "round trips per row")
	rounds := flag.Int("rounds", 20, "blocks each row's round trips are split into; the servers take turns block by block, so drift in the machine's speed falls on all of them alike")
	pools := flag.Int("pools", 50, "served pools")
	endpoints := flag.Int("endpoints", 8, "endpoints per pool")
	bodyKiB := flag.String("body-kib", "1,64", "request body sizes in KiB, comma-separated")
	concFlag := flag.String("concurrency", "1,64", "streams in flight at once, comma-separated")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (all servers) to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole run (all servers) to this file")
	servers := flag.String("servers", "noop,minimal,scheduler", "servers to run, comma-separated: noop (the baseline of the ratios; always runs), minimal (poolpicker with the cheapest picker), scheduler (poolpicker with the default scheduler), traced (the scheduler with a span per request, every one sampled, exported to a discarding exporter)")
	flag.Parse()
	var bodies, concurrency []int
	for _, f := range strings.Split(*bodyKiB, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "-body-kib: %q is not a positive number of KiB\n", f)
			return 2
		}
		bodies = append(bodies, n<<10)
	}
	for _, f := range strings.Split(*concFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "-concurrency: %q is not a positive number of streams\n", f)
			return 2
		}
		concurrency = append(concurrency, n)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "-memprofile:", err)
			}
		}()
	}
	if *rounds <= 0 || *rounds > *requests {
		fmt.Fprintf(os.Stderr, "-rounds: %d must be between 1 and -requests (%d)\n", *rounds, *requests)
		return 2
	}
	cfg := config{requests: *requests, rounds: *rounds, pools: *pools, endpoints: *endpoints, bodies: bodies, concurrency: concurrency}
	for _, name := range strings.Split(*servers, ",") {
		switch strings.TrimSpace(name) {
		case "noop":
		case "minimal":
			cfg.minimal = true
		case "scheduler":
			cfg.scheduler = true
		case "traced":
			cfg.traced = true
		default:
			fmt.Fprintf(os.Stderr, "-servers: unknown server %q (want noop, minimal, scheduler or traced)\n", name)
			return 2
		}
	}
	rows, err := run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	print(os.Stdout, rows)
	return 0
}

type config struct {
	requests, rounds, pools, endpoints int
	minimal, scheduler, traced         bool
	bodies, concurrency                []int
}

type row struct {
	server            string
	body, conc        int
	reqPerSec         float64
	p50, p99          time.Duration
	cpuPerReq         time.Duration
	ratioP50, ratio99 float64
}

// target is one ext_proc server under test.
type target struct {
	name string
	addr string
	stop func()
}

func run(ctx context.Context, cfg config) ([]row, error) {
	targets, err := startTargets(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, t := range targets {
			t.stop()
		}
	}()
	var rows []row
	for _, body := range cfg.bodies {
		payload := makeBody(body)
		for _, conc := range cfg.concurrency {
			sessions := make([]*session, len(targets))
			for i, t := range targets {
				if sessions[i], err = newSession(t, payload, cfg); err != nil {
					return nil, fmt.Errorf("%s body=%d: %w", t.name, body, err)
				}
				defer sessions[i].close()
			}
			rounds := max(cfg.rounds, 1)
			for r := 0; r < rounds; r++ {
				n := cfg.requests / rounds
				if r < cfg.requests%rounds {
					n++
				}
				// Rotate who goes first, so no server always follows the
				// same one.
				for k := range sessions {
					ss := sessions[(r+k)%len(sessions)]
					if err := ss.measure(n, conc); err != nil {
						return nil, fmt.Errorf("%s body=%d conc=%d: %w", ss.t.name, body, conc, err)
					}
				}
			}
			var base row
			for i, ss := range sessions {
				r := ss.row(body, conc)
				if i == 0 {
					base = r
				}
				r.ratioP50 = float64(r.p50) / float64(base.p50)
				r.ratio99 = float64(r.p99) / float64(base.p99)
				rows = append(rows, r)
			}
		}
	}
	return rows, nil
}

func print(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server\tbody\tconc\treq/s\tp50\tp99\tCPU/req\tp50 ratio\tp99 ratio\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%dKiB\t%d\t%.0f\t%v\t%v\t%v\t%.2f\t%.2f\t\n", r.server, r.body>>10, r.conc, r.reqPerSec,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpuPerReq.Round(100*time.Nanosecond), r.ratioP50, r.ratio99)
	}
	tw.Flush()
}

func makeBody(size int) []byte {
	head := `{"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":128,"temperature":0.2,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}],"stream":false}`
	n := max(size-len(head)-len(tail), 0)
	var sb strings.Builder
	words := []string{"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dogs ", "\\n", "\\\"q\\\" "}
	for i := 0; sb.Len() < n; i++ {
		sb.WriteString(words[i%len(words)])
	}
	return []byte(head + sb.String()[:n] + tail)
}

func startTargets(ctx context.Context, cfg config) ([]*target, error) {
	// No-op: answers a fixed endpoint once the body is complete, echoing
	// the chunks; no parsing, no pool resolution, no scheduling.
	noop, err := serve(func(s *grpc.Server) { extprocv3.RegisterExternalProcessorServer(s, noopServer{}) })
	if err != nil {
		return nil, err
	}
	targets := []*target{noop}
	noop.name = "noop"

	variants := []struct{ on, real, traced bool }{{cfg.minimal, false, false}, {cfg.scheduler, true, false}, {cfg.traced, true, true}}
	for _, v := range variants {
		if !v.on {
			continue
		}
		t, err := startPoolpicker(ctx, cfg, v.real, v.traced)
		if err != nil {
			for _, t := range targets {
				t.stop()
			}
			return nil, err
		}
		targets = append(targets, t)
	}
	return targets, nil
}

// startPoolpicker starts poolpicker's server with the default scheduler
// (real) or the cheapest picker; traced gives it a tracer that samples
// every request.
func startPoolpicker(ctx context.Context, cfg config, real, traced bool) (*target, error) {
	reg := datastore.NewRegistry()
	var sched extproc.Scheduler = firstLeastLoaded{}
	name := "poolpicker+minimal-picker"
	if real {
		s, err := scheduling.New(nil, scheduling.Options{})
		if err != nil {
			return nil, err
		}
		reg.AddObserver(s)
		sched, name = s, "poolpicker+scheduler"
	}
	populate(reg, cfg)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		return nil, err
	}
	opts := extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis}
	stopTracing := func() {}
	if traced {
		// The span work of the server (start, attributes, propagation,
		// batching) without a collector's network cost.
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardExporter{}))
		opts.Tracer, name = tp.Tracer("bench"), name+"+tracing"
		stopTracing = func() { _ = tp.Shutdown(context.Background()) }
	}
	srv, err := extproc.New(reg, sched, opts)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = srv.Start(sctx); close(done) }()
	return &target{name: name, addr: lis.Addr().String(), stop: func() { cancel(); <-done; stopTracing() }}, nil
}

func serve(register func(*grpc.Server)) (*target, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// The same flow-control windows as poolpicker's server, so the ratio
	// is poolpicker's work, not a transport setting.
	s := grpc.NewServer(grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(16<<20))
	register(s)
	go func() { _ = s.Serve(lis) }()
	return &target{addr: lis.Addr().String(), stop: s.Stop}, nil
}

func populate(reg *datastore.Registry, cfg config) {
	for i := 0; i < cfg.pools; i++ {
		ns, name := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("pool-%d", i)
		p := reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
			Selector: map[string]string{"app": name}, TargetPorts: []int32{8000}, PickerService: fmt.Sprintf("epp-%d", i), PickerPort: 9002})
		var src []datastore.EndpointSource
		for j := 0; j < cfg.endpoints; j++ {
			src = append(src, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j)},
				UID: types.UID(fmt.Sprintf("%d-%d", i, j)), IP: fmt.Sprintf("127.0.%d.%d", i+1, j+2)})
		}
		p.SetPods(src)
		p.SetSynced(true)
	}
}

// firstLeastLoaded is the cheapest real picker: the endpoint with the
// fewest requests in flight; it isolates the ext_proc server's own cost.
type firstLeastLoaded struct{}

// PromptBytes tells the server the picker reads no prompt, so the server
// only skims it, as it does past the default scheduler's 16 KiB.
func (firstLeastLoaded) PromptBytes() int { return 0 }

// AdmissionSaturated counts no pool saturated: the bench sheds nothing.
func (firstLeastLoaded) AdmissionSaturated(*datastore.Pool) (bool, string) { return false, "" }

func (firstLeastLoaded) ScheduleDeferred(_ context.Context, pool *datastore.Pool, _ *scheduling.Request) (*scheduling.Result, error) {
	eps := pool.Endpoints().Endpoints
	if len(eps) == 0 {
		return nil, scheduling.NewNoEndpointsError("empty pool")
	}
	best := eps[0]
	for _, e := range eps[1:] {
		if e.InFlight() < best.InFlight() {
			best = e
		}
	}
	return &scheduling.Result{Endpoints: []*datastore.Endpoint{best}}, nil
}

// discardExporter drops the spans it is given.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

type noopServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (noopServer) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var chunks [][]byte
	for {
		req, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.GetEndOfStream() {
				if err := srv.Send(decision()); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			chunks = append(chunks, r.RequestBody.GetBody())
			if !r.RequestBody.GetEndOfStream() {
				continue
			}
			if err := srv.Send(decision()); err != nil {
				return err
			}
			for i, c := range chunks {
				if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
					Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
						StreamedResponse: &extprocv3.StreamedBodyResponse{Body: c, EndOfStream: i == len(chunks)-1}}}}}}}); err != nil {
					return err
				}
			}
		}
	}
}

const fixedEndpoint = "127.0.0.2:8000"

func decision() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(fixedEndpoint)}}}}}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint": structpb.NewStringValue(fixedEndpoint)}})}},
	}
}

// chunkBytes is the size of the body messages sent, as Envoy forwards a
// body in buffer-sized pieces.
const chunkBytes = 16 << 10

// session is one server's share of a row: its gateway client, the request
// it is sent, and what was measured so far.
type session struct {
	t        *target
	client   *eppclient.Client
	req      eppclient.Request
	pools    int
	lat      []time.Duration
	cpu      time.Duration
	elapsed  time.Duration
	requests int
}

func newSession(t *target, body []byte, cfg config) (*session, error) {
	// The client keeps one connection per pool authority, as each pool's
	// gateway cluster is its own connection; streams go round-robin over
	// pools.
	ss := &session{t: t, client: eppclient.New(t.addr, eppclient.Options{}), pools: cfg.pools}
	ss.req = eppclient.Request{Shape: eppclient.FullDuplex, Body: body, Chunks: (len(body) + chunkBytes - 1) / chunkBytes,
		Headers: []eppclient.Header{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
			{Key: ":authority", Value: "gw.example"}, {Key: "content-type", Value: "application/json"},
			{Key: "content-length", Value: fmt.Sprint(len(body))}}}
	// Warm up connections and code paths.
	for i := 0; i < min(200, cfg.requests); i++ {
		if _, err := ss.roundTrip(i); err != nil {
			ss.close()
			return nil, err
		}
	}
	return ss, nil
}

func (ss *session) close() { _ = ss.client.Close() }

// measure runs n more round trips, conc at a time, and adds their
// latencies, CPU and wall time to the session's.
func (ss *session) measure(n, conc int) error {
	lat := make([]time.Duration, n)
	var next int64
	var mu sync.Mutex
	var firstErr error
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if int(i) >= n {
					return
				}
				d, err := ss.roundTrip(ss.requests + int(i))
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat[i] = d
			}
		}()
	}
	wg.Wait()
	ss.elapsed += time.Since(start)
	ss.cpu += cpuTime() - cpu0
	if firstErr != nil {
		return firstErr
	}
	ss.lat = append(ss.lat, lat...)
	ss.requests += n
	return nil
}

func (ss *session) row(body, conc int) row {
	lat := slices.Clone(ss.lat)
	slices.Sort(lat)
	return row{server: ss.t.name, body: body, conc: conc, reqPerSec: float64(ss.requests) / ss.elapsed.Seconds(),
		p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], cpuPerReq: ss.cpu / time.Duration(ss.requests)}
}

// roundTrip runs the i-th stream, on pool i's authority, as a full-duplex
// gateway does and returns the time from opening it to the destination
// answer; the client then drains the body answers and closes the stream.
func (ss *session) roundTrip(i int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := ss.req
	p := i % ss.pools
	req.Authority = fmt.Sprintf("epp-%d.ns-%d.svc:9002", p, p%10)
	res, err := ss.client.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	if res.Destination == "" {
		return 0, fmt.Errorf("no destination: %+v", res)
	}
	return res.Decided, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
