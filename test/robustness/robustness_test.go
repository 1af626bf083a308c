// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package robustness_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// The picker's limits in this suite: deadlines short enough to wait for,
// a stream limit above the idle-stream case's 2,000, a small body budget.
const (
	bodyStartTimeout = 30 * time.Second
	bodyTimeout      = 2 * time.Second
	responseIdle     = 3 * time.Second
	maxStreams       = 2500
	maxBodyBytes     = 4 << 20
	heldBudget       = 32 << 20
	// rssSlack is how far above its size before the cases the picker's
	// resident memory may stay after one: the held-body budget (up to twice
	// over, messages and copies) and gRPC's buffers of the refused
	// messages, which the Go runtime keeps a while for reuse before it
	// gives them back to the system.
	rssSlack = 160 << 20
)

var (
	stack       *localstack.Stack
	grpcAddr    string
	metricsAddr string
	httpClient  = &http.Client{Timeout: time.Minute}
)

// pools are the samples' pools: the Host routed to each, its picker
// Service (the ext_proc :authority), and a model it serves.
var pools = []struct{ host, authority, model string }{
	{"chat.team-a.example", "epp-chat.team-a.svc:9002", "meta-llama/Llama-3.1-8B-Instruct"},
	{"lora.team-a.example", "epp-lora.team-a.svc:9002", "sql-lora"},
	{"code.team-b.example", "epp-code.team-b.svc:9002", "Qwen/Qwen2.5-Coder-7B-Instruct"},
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ports, err := localstack.FreePorts(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := filepath.Abs(".artifacts")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = os.RemoveAll(dir)
	// Built without -race: the suite measures the process's memory.
	s, err := localstack.Start(context.Background(), localstack.Options{
		Dir:         dir,
		FirstIP:     "127.0.80.2", // a range of its own: other packages start pods at the same time
		GatewayAddr: "127.0.0.1:0",
		GRPCPort:    ports[0], HealthPort: ports[1], MetricsPort: ports[2],
		PickerArgs: []string{
			"--request-body-start-timeout=" + bodyStartTimeout.String(),
			"--request-body-timeout=" + bodyTimeout.String(),
			"--response-idle-timeout=" + responseIdle.String(),
			fmt.Sprintf("--max-concurrent-streams=%d", maxStreams),
			fmt.Sprintf("--max-request-body-bytes=%d", maxBodyBytes),
			fmt.Sprintf("--max-held-request-body-bytes=%d", heldBudget),
			// No reserve: the idle streams fill each pool's fair share of
			// --max-concurrent-streams exactly, so that the streams past
			// it meet the process-wide limit itself (idleStreams).
			"--fair-share-reserve-percent=-1",
		},
		Logger: funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, p, a) }, funcr.Options{Verbosity: 0}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "robustness: starting the local stack:", err)
		return 1
	}
	stack = s
	grpcAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	metricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	code := m.Run()
	httpClient.CloseIdleConnections()
	conns.Close()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "robustness: stopping the local stack:", err)
		code = 1
	}
	if code == 0 {
		if err := testenv.LeakedGoroutines(); err != nil {
			fmt.Fprintln(os.Stderr, "robustness: goroutines left behind:", err)
			code = 1
		}
	}
	return code
}

// TestHostileInput sends each case to the running picker, then checks
// that the process runs, routes a request for every pool through the
// gateway, and that its resident memory settles back near where it was.
func TestHostileInput(t *testing.T) {
	routesEveryPool(t)
	base := rss(t)
	t.Logf("picker RSS before the cases: %d MiB", base>>20)
	for _, c := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"header values", headerValues},
		{"huge metadata", hugeMetadata},
		{"idle streams within and beyond the limit", idleStreams},
		{"bodies never ended and the held-body budget", bodiesNeverEnded},
		{"response phase never sent", responseNeverSent},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.run(t)
			if _, err := stack.Picker.Running(); err != nil {
				t.Fatalf("after %s: %v\n%s", c.name, err, logTail())
			}
			routesEveryPool(t)
			var now int64
			poll.Until(t, 2*time.Minute, "picker RSS back within bounds", func() bool {
				now = rss(t)
				return now <= base+rssSlack
			})
			t.Logf("picker RSS after %s: %d MiB (before the cases %d MiB)", c.name, now>>20, base>>20)
		})
	}
	if _, err := stack.Picker.Running(); err != nil {
		t.Fatal(err)
	}
}

// routesEveryPool sends one request per pool through the gateway and
// wants each served (200) by its pool.
func routesEveryPool(t *testing.T) {
	t.Helper()
	for _, p := range pools {
		b, _ := json.Marshal(map[string]any{"model": p.model, "prompt": "still there?", "max_tokens": 2})
		req, err := http.NewRequest(http.MethodPost, stack.GatewayURL+"/v1/completions", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = p.host
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("pool %s: %v", p.host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("pool %s: %d %s", p.host, resp.StatusCode, body)
		}
	}
}

// rss is the picker process's resident set size, from /proc/PID/status.
func rss(t *testing.T) int64 {
	t.Helper()
	pid, err := stack.Picker.Running()
	if err != nil {
		t.Fatal(err)
	}
	n, err := testenv.RSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func logTail() string {
	b, _ := os.ReadFile(stack.Picker.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// metric is the sum of a picker metric's series whose labels include
// match.
func metric(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	n, err := testenv.MetricSum(httpClient, "http://"+metricsAddr+"/metrics", name, match)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// conns keeps one connection per :authority.
var conns = testenv.PickerConns{MaxMsgBytes: 64 << 20}

func conn(t *testing.T, authority string) *grpc.ClientConn {
	t.Helper()
	c, err := conns.Get(grpcAddr, authority)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stream is one hostile gateway stream.
type stream struct {
	extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func open(t *testing.T, authority string) (*stream, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	s, err := extprocv3.NewExternalProcessorClient(conn(t, authority)).Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &stream{s, cancel}, nil
}

func headers(eos bool, extra ...*corev3.HeaderValue) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: ":authority", RawValue: []byte("gateway.example")}, {Key: "content-type", RawValue: []byte("application/json")},
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: append(hs, extra...)}, EndOfStream: eos}},
	}
}

func body(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// answer sends msgs and returns the first answer, or the status the
// stream ended with.
func answer(t *testing.T, authority string, msgs ...*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	t.Helper()
	s, err := open(t, authority)
	if err != nil {
		return nil, err
	}
	defer s.cancel()
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			break // the picker ended the stream; Recv says how
		}
	}
	return s.Recv()
}

// readHeaders are the request headers poolpicker reads.
var readHeaders = []string{
	":path", ":method", "content-length", "x-request-id",
	"x-llm-d-inference-objective", "x-gateway-inference-objective",
	"x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite",
	"x-epp-host", "x-epp-port", "traceparent", "tracestate",
	"x-gateway-inference-pool", "test-epp-endpoint-selection",
}

// headerValues sends, in every header poolpicker reads, bytes that are not
// UTF-8 (in raw_value: value is a protobuf string, always UTF-8), control
// bytes and an oversized value (in raw_value and value). A
// model rewrite header that is not UTF-8 (bytes ff fe fd, the issue's
// crash) must be refused 400 naming the header; every other answer (a
// pick, a 4xx/5xx) is the picker's to choose, as long as it answers.
func headerValues(t *testing.T) {
	values := map[string][]byte{
		"not UTF-8": {0xff, 0xfe, 0xfd},
		"control":   []byte("a\x00b\x01c\x7f\r\nd"),
		"oversized": bytes.Repeat([]byte("x"), 256<<10),
	}
	p := pools[0]
	req := []byte(fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, p.model))
	for _, h := range readHeaders {
		for what, v := range values {
			for _, raw := range []bool{true, false} {
				if !raw && what == "not UTF-8" {
					continue // value is a protobuf string: gRPC cannot carry it (nor can a gateway)
				}
				hv := &corev3.HeaderValue{Key: h}
				if raw {
					hv.RawValue = v
				} else {
					hv.Value = string(v)
				}
				resp, err := answer(t, p.authority, headers(false, hv), body(req, true))
				if err != nil && status.Code(err) != codes.Internal && status.Code(err) != codes.Unavailable {
					// A stream may be refused; the process must not die.
					t.Logf("%s %s (raw %v): stream ended %v", h, what, raw, err)
				}
				if err != nil && status.Code(err) == codes.Internal {
					t.Errorf("%s %s (raw %v): a panic was recovered: %v", h, what, raw, err)
				}
				if _, err := stack.Picker.Running(); err != nil {
					t.Fatalf("header %s, %s value (raw %v): %v\n%s", h, what, raw, err, logTail())
				}
				if what == "not UTF-8" && strings.Contains(h, "model-name-rewrite") {
					ir := resp.GetImmediateResponse()
					if ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), h) {
						t.Errorf("%s = ff fe fd (raw %v): got %v, want a 400 naming the header", h, raw, resp)
					}
				}
			}
		}
	}
}

// hugeMetadata sends a subset hint of 200,000 addresses, a metadata
// namespace of as many keys, and attributes as large (the last two over
// the picker's message limit, which gRPC refuses).
func hugeMetadata(t *testing.T) {
	p := pools[1]
	req := []byte(fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, p.model))
	list := make([]*structpb.Value, 200_000)
	fields := make(map[string]*structpb.Value, len(list))
	for i := range list {
		a := fmt.Sprintf("10.%d.%d.%d:8000", i>>16, (i>>8)&255, i&255)
		list[i] = structpb.NewStringValue(a)
		fields[a] = structpb.NewStringValue(a)
	}
	for _, md := range []*corev3.Metadata{
		{FilterMetadata: map[string]*structpb.Struct{"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint-subset": structpb.NewListValue(&structpb.ListValue{Values: list})}}}},
		{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {Fields: fields}}},
	} {
		m := headers(false)
		m.MetadataContext = md
		resp, err := answer(t, p.authority, m, body(req, true))
		t.Logf("huge metadata: %v %v", summary(resp), err)
		if status.Code(err) == codes.Internal {
			t.Errorf("huge metadata: a panic was recovered: %v", err)
		}
	}
	m := headers(false)
	m.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
	resp, err := answer(t, p.authority, m, body(req, true))
	t.Logf("huge attributes: %v %v", summary(resp), err)
}

func summary(r *extprocv3.ProcessingResponse) string {
	if ir := r.GetImmediateResponse(); ir != nil {
		return fmt.Sprintf("immediate %d %.200s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	if r == nil {
		return "no answer"
	}
	return fmt.Sprintf("%T", r.GetResponse())
}

// idleStreams opens 2,000 streams that send their headers and nothing
// more, checks every pool is still routed while they are open, then opens
// more than the limit leaves room for: the excess is refused at once with
// RESOURCE_EXHAUSTED naming the flag. The open ones end on their own at
// --request-body-start-timeout, answered 408.
func idleStreams(t *testing.T) {
	const idle = 2000
	var held []*stream
	defer func() {
		for _, s := range held {
			s.cancel()
		}
	}()
	// The streams go to the pools in proportion to their fair shares of
	// the limit (team-a's two pools share their namespace's half, team-b's
	// one pool has the other half), so that every pool stays within its
	// share until the process-wide limit is reached.
	inShare := []int{0, 2, 1, 2}
	openIdle := func(n int) (refused []error) {
		for i := 0; i < n; i++ {
			s, err := open(t, pools[inShare[i%len(inShare)]].authority)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(headers(false)); err != nil {
				_, err = s.Recv()
				refused = append(refused, err)
				s.cancel()
				continue
			}
			held = append(held, s)
		}
		return refused
	}
	if refused := openIdle(idle); len(refused) > 0 {
		t.Fatalf("%d of %d idle streams refused within the limit of %d, first: %v", len(refused), idle, maxStreams, refused[0])
	}
	poll.Until(t, time.Minute, "2,000 streams open", func() bool { return metric(t, "poolpicker_extproc_streams", nil) >= idle })
	t.Logf("picker RSS with %d idle streams: %d MiB", idle, rss(t)>>20)
	routesEveryPool(t)
	// An idle stream's Send succeeds before the picker refuses it, so the
	// refusals show on Recv; count them there.
	before := metric(t, "poolpicker_extproc_limit_rejections_total", map[string]string{"limit": "concurrent_streams"})
	extra := openIdle(maxStreams - idle + 100)
	poll.Until(t, time.Minute, "the excess refused", func() bool {
		return metric(t, "poolpicker_extproc_limit_rejections_total", map[string]string{"limit": "concurrent_streams"})-before >= 100
	})
	// Those that got a Send through see the refusal on Recv; the last
	// opened are the refused ones.
	var refusedMsg string
	for i := len(held) - 1; i >= idle && refusedMsg == ""; i-- {
		if _, err := recvWithin(held[i], 2*time.Second); status.Code(err) == codes.ResourceExhausted {
			refusedMsg = err.Error()
		}
	}
	for _, err := range extra {
		if status.Code(err) == codes.ResourceExhausted {
			refusedMsg = err.Error()
		}
	}
	if !strings.Contains(refusedMsg, "--max-concurrent-streams") {
		t.Errorf("a refused stream's status %q does not name --max-concurrent-streams", refusedMsg)
	}
	// Left alone, the idle streams end at the body-start deadline.
	poll.Until(t, bodyStartTimeout+time.Minute, "idle streams ended by their deadline", func() bool {
		return metric(t, "poolpicker_extproc_streams", nil) == 0
	})
	if n := metric(t, "poolpicker_extproc_limit_rejections_total", map[string]string{"limit": "request_body_start_timeout"}); n < idle {
		t.Errorf("request_body_start_timeout rejections %v, want at least %d", n, idle)
	}
}

// samplePeak reads a gauge of the picker's metrics until done is closed
// and returns the largest value it saw; a failed read is skipped (the
// caller's own reads report a broken endpoint).
func samplePeak(addr, name string, done <-chan struct{}) float64 {
	var peak float64
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return peak
		case <-tick.C:
		}
		resp, err := httpClient.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, m := range fams[name].GetMetric() {
			peak = max(peak, m.GetGauge().GetValue())
		}
	}
}

// recvWithin waits up to d for the stream's next answer.
func recvWithin(s *stream, d time.Duration) (*extprocv3.ProcessingResponse, error) {
	type res struct {
		m   *extprocv3.ProcessingResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-time.After(d):
		s.cancel()
		r := <-ch
		return r.m, r.err
	}
}

// bodiesNeverEnded opens 100 streams that each send 512 KiB of body and
// never end it: about the budget's worth are held (each counts twice, the
// message and the parser's copy), the rest are answered 503 naming
// --max-held-request-body-bytes; the held ones are answered 408 at
// --request-body-timeout, and the budget comes back to zero. The held
// bytes, read from the picker's gauge while the streams run, never exceed
// the budget. (The count of 408s is no bound: a stream that starts after
// the first held ones timed out is held in the budget they gave back.)
func bodiesNeverEnded(t *testing.T) {
	const n, part = 100, 512 << 10
	chunk := append([]byte(`{"model":"m","prompt":"`), bytes.Repeat([]byte("a"), part-23)...)
	codesSeen := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	done := make(chan struct{})
	peak := make(chan float64, 1)
	go func() { peak <- samplePeak(metricsAddr, "poolpicker_extproc_held_request_body_bytes", done) }()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pools[i%len(pools)]
			resp, err := answer(t, p.authority, headers(false), body(chunk, false))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codesSeen[-int(status.Code(err))]++
				return
			}
			ir := resp.GetImmediateResponse()
			codesSeen[int(ir.GetStatus().GetCode())]++
			if c := ir.GetStatus().GetCode(); (c == 503 && !strings.Contains(string(ir.GetBody()), "--max-held-request-body-bytes")) ||
				(c == 408 && !strings.Contains(string(ir.GetBody()), "--request-body-timeout")) {
				t.Errorf("answer %d does not name its flag: %s", c, ir.GetBody())
			}
		}()
	}
	wg.Wait()
	close(done)
	held := <-peak
	t.Logf("answers to %d bodies never ended (negative: gRPC codes): %v; most body bytes seen held: %.0f", n, codesSeen, held)
	if codesSeen[408] == 0 || codesSeen[503] == 0 || codesSeen[408]+codesSeen[503] != n {
		t.Errorf("answers %v: want each stream answered 408 (held, then timed out) or 503 (over the budget)", codesSeen)
	}
	if held > heldBudget {
		t.Errorf("%.0f body bytes held at once, more than the budget of %d bytes", held, heldBudget)
	}
	if held == 0 {
		t.Errorf("the held-body gauge never showed a held body while %d streams held theirs", codesSeen[408])
	}
	poll.Until(t, time.Minute, "held bytes back to zero", func() bool {
		return metric(t, "poolpicker_extproc_held_request_body_bytes", nil) == 0
	})
}

// responseNeverSent routes 50 requests whose gateway never sends the
// response phase: each stream ends DEADLINE_EXCEEDED at
// --response-idle-timeout and its request stops counting as running.
func responseNeverSent(t *testing.T) {
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pools[i%len(pools)]
			s, err := open(t, p.authority)
			if err != nil {
				errs <- err
				return
			}
			defer s.cancel()
			req := []byte(fmt.Sprintf(`{"model":%q,"prompt":"never answered","max_tokens":2}`, p.model))
			if err := s.Send(headers(false)); err != nil {
				errs <- err
				return
			}
			if err := s.Send(body(req, true)); err != nil {
				errs <- err
				return
			}
			for {
				_, err := s.Recv()
				if err != nil {
					if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--response-idle-timeout") {
						errs <- fmt.Errorf("stream ended %w, want DEADLINE_EXCEEDED naming --response-idle-timeout", err)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	poll.Until(t, time.Minute, "no request left running", func() bool {
		return metric(t, "inference_objective_running_requests", nil) == 0
	})
}
