// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// panicky is a scheduling plugin that panics on cue, by target model: a
// request for "panic-pick" panics while picking (Score), one for
// "panic-commit" in Result.Commit (PostPick), after its decision is sent
// and its in-flight count taken.
type panicky struct{}

const panickyType = "panicky"

func (panicky) TypedName() framework.TypedName {
	return framework.TypedName{Type: panickyType, Name: panickyType}
}

func (panicky) Score(_ context.Context, cs *framework.CycleState, _ *framework.Request, _ []framework.Candidate, _ []float64) *framework.Status {
	if cs.TargetModel == "panic-pick" {
		panic("test: a scorer panics")
	}
	return nil
}

func (panicky) PostPick(_ context.Context, cs *framework.CycleState, _ *framework.Request, _ *framework.Result) {
	if cs.TargetModel == "panic-commit" {
		panic("test: a post-pick plugin panics")
	}
}

// newPanickyPools is newPools with a real scheduler whose one scorer is
// panicky.
func newPanickyPools(t testing.TB, n, podsPerPool int) (*poolFixture, *scheduling.Scheduler) {
	t.Helper()
	plugins := scheduling.NewRegistry()
	if err := plugins.Register(panickyType, func(string, json.RawMessage, framework.Handle) (framework.Plugin, error) { return panicky{}, nil }); err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(nil, scheduling.Options{Registry: plugins, ConfigText: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: " + panickyType + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	f := &poolFixture{reg: datastore.NewRegistry()}
	f.reg.AddObserver(sched)
	for i := 0; i < n; i++ {
		f.add(i, poolNS(i), poolName(i), poolSvc(i), 9002, podsPerPool)
	}
	return f, sched
}

// statusOf reads the stream until it ends and returns its status code
// (OK for a clean end).
func (g *gw) statusOf() codes.Code {
	g.t.Helper()
	for {
		if _, err := g.stream.Recv(); errors.Is(err, io.EOF) {
			return codes.OK
		} else if err != nil {
			return status.Code(err)
		}
	}
}

// route sends a whole FULL_DUPLEX request to pool p and returns the
// destination the headers answer names, or an error.
func route(ts *testServer, t testing.TB, p int, model string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(ts.conn(t, authorityOf(p))).Process(ctx)
	if err != nil {
		return "", err
	}
	// A failed Send means the server ended the stream: Recv says how.
	_ = s.Send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	_ = s.Send(reqBody(completionBody(model, 10), true))
	hr, err := s.Recv()
	if err != nil {
		return "", err
	}
	dest, ok := mutationHeader(hr.GetRequestHeaders().GetResponse().GetHeaderMutation(), HeaderDestination)
	if !ok {
		return "", fmt.Errorf("no destination in %v", hr)
	}
	return dest, nil
}

// TestPanicEndsOnlyItsStream: a plugin that panics while picking, or after
// the decision, ends its own stream with INTERNAL, is counted and logged,
// releases the in-flight count; streams running at the same time, in the
// same and other pools, are routed.
func TestPanicEndsOnlyItsStream(t *testing.T) {
	f, sched := newPanickyPools(t, 4, 2)
	ts := startServer(t, f.reg, sched, Options{Insecure: true})

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := route(ts, t, i%4, "m"); err != nil {
				errs <- fmt.Errorf("healthy stream %d: %w", i, err)
			}
		}()
	}
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := route(ts, t, i%4, "panic-pick"); status.Code(err) != codes.Internal {
				errs <- fmt.Errorf("panic while picking: got %v, want INTERNAL", status.Convert(err))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// After the decision: the gateway has its destination, then the
	// stream ends INTERNAL and the count it took is given back.
	g := ts.open(t, authorityOf(1), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	g.send(reqBody(completionBody("panic-commit", 10), true))
	hr := g.recv()
	checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 1)
	if c := g.statusOf(); c != codes.Internal {
		t.Fatalf("panic after the decision: stream ended %v, want INTERNAL", c)
	}
	eventually(t, "in-flight released", func() bool { return f.totalInFlight() == 0 })
	if n := testutil.ToFloat64(ts.srv.limits.panics); n != 11 {
		t.Errorf("poolpicker_extproc_panics_total = %v, want 11", n)
	}
	eventually(t, "streams closed", func() bool { return ts.srv.limits.streams.Total() == 0 })
	for p := 0; p < 4; p++ {
		if _, err := route(ts, t, p, "m"); err != nil {
			t.Errorf("pool %d after the panics: %v", p, err)
		}
	}
}

// TestMaxConcurrentStreams: streams past the limit are refused at once
// with RESOURCE_EXHAUSTED naming the limit and its flag, and counted;
// once streams end, new ones are admitted again.
func TestMaxConcurrentStreams(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxConcurrentStreams: 5, BodyWaitTimeout: time.Hour})
	var open []*gw
	for i := 0; i < 5; i++ {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		open = append(open, g)
	}
	eventually(t, "five streams open", func() bool { return ts.srv.limits.streams.Total() == 5 })
	_, err := route(ts, t, 1, "m")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-concurrent-streams") || !strings.Contains(err.Error(), "5 streams") {
		t.Fatalf("sixth stream: %v, want RESOURCE_EXHAUSTED naming the limit and --max-concurrent-streams", err)
	}
	if n := testutil.ToFloat64(ts.srv.limits.rejections.WithLabelValues(limitConcurrentStreams)); n != 1 {
		t.Errorf("rejections{limit=concurrent_streams} = %v, want 1", n)
	}
	for _, g := range open {
		g.send(reqBody(completionBody("m", 1), true))
		g.recv()
		g.recv()
		g.expectEOF()
	}
	eventually(t, "streams closed", func() bool { return ts.srv.limits.streams.Total() == 0 })
	if _, err := route(ts, t, 1, "m"); err != nil {
		t.Fatalf("after the streams ended: %v", err)
	}
	eventually(t, "in-flight released", func() bool { return f.totalInFlight() == 0 })
}

// TestStreamDeadlines: each state's deadline ends a stream stuck in it
// with the answer that state calls for, counted per limit, and gives back
// what the stream held.
func TestStreamDeadlines(t *testing.T) {
	f := newPools(t, 2, 2)
	const short = 300 * time.Millisecond
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, RequestBodyStartTimeout: short, RequestBodyTimeout: short, ResponseIdleTimeout: time.Second})
	rejected := func(limit string) float64 { return testutil.ToFloat64(ts.srv.limits.rejections.WithLabelValues(limit)) }
	expect408 := func(t *testing.T, g *gw, flag string) {
		t.Helper()
		code, body := immediateCode(t, g.recvWithin(10*time.Second))
		if code != 408 || !strings.Contains(body, flag) || !strings.Contains(body, `"type":"invalid_request_error"`) {
			t.Fatalf("got %d %s, want 408 naming %s", code, body, flag)
		}
		if c := g.statusOf(); c != codes.OK {
			t.Fatalf("stream ended %v after the 408, want OK", c)
		}
	}

	t.Run("no message at all", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		expect408(t, g, "--request-body-start-timeout")
	})
	t.Run("headers, no body (full duplex)", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		expect408(t, g, "--request-body-start-timeout")
	})
	t.Run("headers answered, no body (buffered)", func(t *testing.T) {
		g := ts.open(t, authorityOf(1), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), buffered, buffered))
		if hr := g.recv(); hr.GetRequestHeaders() == nil {
			t.Fatalf("headers not answered: %v", hr)
		}
		expect408(t, g, "--request-body-start-timeout")
	})
	if n := rejected(limitBodyStart); n != 3 {
		t.Errorf("rejections{limit=%s} = %v, want 3", limitBodyStart, n)
	}
	t.Run("a GET never waits", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("GET", "/v1/models"), true), duplex, duplex))
		hr := g.recv()
		checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
	})
	t.Run("body held without end of stream", func(t *testing.T) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		g.send(reqBody([]byte(`{"model":"m","prompt":"never ends`), false))
		expect408(t, g, "--request-body-timeout")
		if n := rejected(limitBody); n != 1 {
			t.Errorf("rejections{limit=%s} = %v, want 1", limitBody, n)
		}
	})
	t.Run("response phase never sent", func(t *testing.T) {
		g := ts.open(t, authorityOf(1), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		g.send(reqBody(completionBody("m", 1), true))
		g.recv()
		g.recv()
		if n := f.totalInFlight(); n != 1 {
			t.Fatalf("in flight while forwarded: %d, want 1", n)
		}
		if c := g.statusOf(); c != codes.DeadlineExceeded {
			t.Fatalf("stream ended %v, want DEADLINE_EXCEEDED", c)
		}
		eventually(t, "in-flight released", func() bool { return f.totalInFlight() == 0 })
		if n := rejected(limitResponseIdle); n != 1 {
			t.Errorf("rejections{limit=%s} = %v, want 1", limitResponseIdle, n)
		}
	})
	t.Run("a long response that keeps talking is not cut", func(t *testing.T) {
		g := ts.open(t, authorityOf(1), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		g.send(reqBody(completionBody("m", 1), true))
		g.recv()
		g.recv()
		g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", "text/event-stream", true}}, false, ""))
		g.recv()
		// Three times the idle timeout in all, a chunk every tenth of it.
		for i := 0; i < 30; i++ {
			time.Sleep(100 * time.Millisecond) // the gap between chunks is the test's subject
			g.send(respBody([]byte("data: {}\n\n"), false))
			g.recv()
		}
		g.send(respBody([]byte("data: [DONE]\n\n"), true))
		g.recv()
		g.expectEOF()
		if n := rejected(limitResponseIdle); n != 1 {
			t.Errorf("rejections{limit=%s} = %v, want still 1", limitResponseIdle, n)
		}
	})
	eventually(t, "streams closed", func() bool { return ts.srv.limits.streams.Total() == 0 && ts.srv.limits.held.Total() == 0 })
}

// TestHeldBodyBudget: a stream whose chunk would overspend the process's
// held-body budget is answered 503 naming the flag and lets go of what it
// held; the budget comes back as streams decide or end. A body counts
// once, each of its messages bodyMsgOverheadBytes more.
func TestHeldBodyBudget(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxHeldRequestBodyBytes: 1000})
	held := func() int64 { return ts.srv.limits.held.Total() }
	part := []byte(`{"model":"m","prompt":"` + strings.Repeat("a", 277)) // 300 bytes

	a := ts.open(t, authorityOf(0), nil)
	a.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	a.send(reqBody(part, false))
	eventually(t, "the first part held once, with its message's overhead", func() bool { return held() == 300+bodyMsgOverheadBytes })

	b := ts.open(t, authorityOf(1), nil)
	b.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	b.send(reqBody([]byte(`{"model":"m","prompt":"x`), false)) // 24+256 bytes: within
	b.send(reqBody(part, false))                               // 556 more: over
	code, body := immediateCode(t, b.recv())
	if code != 503 || !strings.Contains(body, "--max-held-request-body-bytes") || !strings.Contains(body, "pool "+poolNS(1)+"/"+poolName(1)) {
		t.Fatalf("over budget: %d %s, want 503 naming --max-held-request-body-bytes and the pool", code, body)
	}
	if n := testutil.ToFloat64(ts.srv.limits.rejections.WithLabelValues(limitHeldBodyBytes)); n != 1 {
		t.Errorf("rejections{limit=%s} = %v, want 1", limitHeldBodyBytes, n)
	}
	eventually(t, "the refused stream let go of its part", func() bool { return held() == 300+bodyMsgOverheadBytes })

	a.send(reqBody([]byte(`"}`), true))
	hr := a.recv()
	checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 0)
	eventually(t, "the decided stream let go of its body", func() bool { return held() == 0 })

	// One message of 600 bytes fits once nothing else is held.
	c := ts.open(t, authorityOf(1), nil)
	c.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	c.send(reqBody(completionBody("m", 500), true))
	hr = c.recv()
	checkPool(t, f, destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()), 1)
	a.cancel()
	c.cancel()
	eventually(t, "no stream, byte or request held once the gateways went away", func() bool {
		return held() == 0 && ts.srv.limits.streams.Total() == 0 && f.totalInFlight() == 0
	})
}

// TestBodyChargedOnce: a body sent in many messages is charged its bytes
// once, plus each message's overhead; empty messages are charged their
// overhead, not nothing; and the body is forwarded whole, cut as it came.
func TestBodyChargedOnce(t *testing.T) {
	f := newPools(t, 1, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	held := func() int64 { return ts.srv.limits.held.Total() }
	cases := []struct {
		name   string
		chunks [][]byte
	}{
		{"16 MiB in many messages", func() [][]byte {
			out := [][]byte{[]byte(`{"model":"m","prompt":"`)}
			for i := 0; i < 15; i++ {
				out = append(out, []byte(strings.Repeat("a", 1<<20)))
			}
			// The last message ("}) makes 16 MiB, the default body limit.
			return append(out, []byte(strings.Repeat("a", 1<<20-len(out[0])-2)))
		}()},
		{"a hundred empty messages", func() [][]byte {
			out := [][]byte{[]byte(`{"model":"m","prompt":"`)}
			for i := 0; i < 100; i++ {
				out = append(out, nil)
			}
			return out
		}()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := ts.open(t, authorityOf(0), nil)
			g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
			want := int64(0)
			for _, c := range tc.chunks {
				g.send(reqBody(c, false))
				want += int64(len(c)) + bodyMsgOverheadBytes
			}
			eventually(t, fmt.Sprintf("%d bytes held", want), func() bool { return held() == want })
			g.send(reqBody([]byte(`"}`), true))
			if r := g.recv(); r.GetRequestHeaders() == nil {
				t.Fatalf("first answer %v, want the headers' decision", r)
			}
			var forwarded int
			for i := 0; i <= len(tc.chunks); i++ { // an answer per message, the last included
				forwarded += len(g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
			}
			if sent := int(want) - (len(tc.chunks) * bodyMsgOverheadBytes) + 2; forwarded != sent {
				t.Fatalf("forwarded %d body bytes, sent %d", forwarded, sent)
			}
			eventually(t, "nothing held once decided", func() bool { return held() == 0 })
			g.cancel()
		})
	}
}

// firstAnswers reads each stream's first answer (its refusal, for a
// stream refused) onto the channel returned; the readers end with the
// streams.
func firstAnswers(gs []*gw) <-chan *extprocv3.ProcessingResponse {
	out := make(chan *extprocv3.ProcessingResponse, len(gs))
	for _, g := range gs {
		go func() {
			if r, err := g.stream.Recv(); err == nil {
				out <- r
			}
		}()
	}
	return out
}

// refusals takes n answers from answers and checks each is code for pool
// p naming flag.
func refusals(t *testing.T, answers <-chan *extprocv3.ProcessingResponse, n, code, p int, flag string) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case r := <-answers:
			c, body := immediateCode(t, r)
			if c != code || !strings.Contains(body, "pool "+poolNS(p)+"/"+poolName(p)) || !strings.Contains(body, flag) {
				t.Fatalf("refused stream of pool %d: %d %s, want %d naming the pool and %s", p, c, body, code, flag)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d refused streams answered", i, n)
		}
	}
}

// TestFairShareOfHeldBodies: four streams of one pool that send bodies
// and never end them take no more than their pool's share of the
// held-body budget; a request of another tenant's pool is routed, and
// the streams refused are answered 503 for their own pool.
func TestFairShareOfHeldBodies(t *testing.T) {
	f := newPools(t, 2, 2)
	const budget = 32 << 20
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxHeldRequestBodyBytes: budget})
	chunk := []byte(strings.Repeat("a", 1<<20))
	var hostile []*gw
	for i := 0; i < 4; i++ {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		g.send(reqBody([]byte(`{"model":"m","prompt":"`), false))
		for j := 0; j < 8; j++ {
			if g.stream.Send(reqBody(chunk, false)) != nil {
				break // refused: the server ended the stream
			}
		}
		hostile = append(hostile, g)
	}
	answers := firstAnswers(hostile)
	rejected := func() float64 {
		return testutil.ToFloat64(ts.srv.limits.rejections.WithLabelValues(limitHeldBodyBytes))
	}
	eventually(t, "a stream of pool 0 refused", func() bool { return rejected() >= 1 })
	share := int64(budget - budget*10/100) // a lone pool's: all but the reserve
	if h := ts.srv.limits.held.Party(poolNS(0), poolName(0)).Held(); h > share {
		t.Fatalf("pool 0 holds %d bytes, over its share %d", h, share)
	}
	if _, err := route(ts, t, 1, "m"); err != nil {
		t.Fatalf("pool 1's request while pool 0 holds its share: %v", err)
	}
	refusals(t, answers, int(rejected()), 503, 0, "--max-held-request-body-bytes")
}

// TestFairShareOfStreams: one pool's streams that send headers and stop
// take no more than the pool's share of --max-concurrent-streams; the
// ones past it are answered 429 for that pool, and another tenant's pool
// is served.
func TestFairShareOfStreams(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxConcurrentStreams: 20, BodyWaitTimeout: time.Hour})
	var hostile []*gw
	for i := 0; i < 20; i++ {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
		hostile = append(hostile, g)
	}
	answers := firstAnswers(hostile)
	pool0 := ts.srv.limits.streams.Party(poolNS(0), poolName(0))
	// A lone pool's share: all but the reserve, 10 % of 20.
	eventually(t, "pool 0 holds 18 streams, 2 refused", func() bool {
		return pool0.Held() == 18 && ts.srv.limits.streams.Total() == 18 &&
			testutil.ToFloat64(ts.srv.limits.rejections.WithLabelValues(limitConcurrentStreams)) == 2
	})
	refusals(t, answers, 2, 429, 0, "--max-concurrent-streams")
	if _, err := route(ts, t, 1, "m"); err != nil {
		t.Fatalf("pool 1's request while pool 0 holds its share of streams: %v", err)
	}
}

// TestSubsetHintBound: a subset hint longer than DefaultMaxSubsetHintEntries is
// answered 400 naming the key and the bound; one at the bound is honoured.
func TestSubsetHintBound(t *testing.T) {
	f := newPools(t, 1, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	hint := func(n int) *extprocv3.ProcessingRequest {
		vals := []*structpb.Value{structpb.NewStringValue(f.pools[0].Endpoints().Endpoints[0].Address)}
		for i := len(vals); i < n; i++ {
			vals = append(vals, structpb.NewStringValue(fmt.Sprintf("10.%d.%d.%d:8000", i>>16, (i>>8)&255, i&255)))
		}
		m := withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{
			MetadataKeySubset: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
		return m
	}
	g := ts.open(t, authorityOf(0), nil)
	g.send(hint(DefaultMaxSubsetHintEntries + 1))
	code, body := immediateCode(t, g.recv())
	if code != 400 || !strings.Contains(body, MetadataKeySubset) || !strings.Contains(body, "10000 allowed") {
		t.Fatalf("over the bound: %d %s, want 400 naming the hint and its bound", code, body)
	}
	small := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true, MaxSubsetHintEntries: 3})
	g = small.open(t, authorityOf(0), nil)
	g.send(hint(4))
	if code, body := immediateCode(t, g.recv()); code != 400 || !strings.Contains(body, "3 allowed (--max-subset-hint-entries)") {
		t.Fatalf("over an operator's bound of 3: %d %s, want 400 naming the bound and its flag", code, body)
	}
	g = ts.open(t, authorityOf(0), nil)
	g.send(hint(DefaultMaxSubsetHintEntries))
	g.send(reqBody(completionBody("m", 1), true))
	hr := g.recv()
	if got := destination(t, hr, hr.GetRequestHeaders().GetResponse().GetHeaderMutation()); !strings.HasPrefix(got, f.pools[0].Endpoints().Endpoints[0].Address) {
		t.Fatalf("at the bound: routed to %s, want the hinted endpoint", got)
	}
}

// A hint that names no single pool is answered 503 with a message that
// quotes a few of its entries, not all of them: the message goes into the
// response body and a log line.
func TestUnresolvedSubsetHintMessageBounded(t *testing.T) {
	f := newPools(t, 2, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	vals := []*structpb.Value{
		structpb.NewStringValue(f.pools[0].Endpoints().Endpoints[0].Address),
		structpb.NewStringValue(f.pools[1].Endpoints().Endpoints[0].Address),
	}
	for i := len(vals); i < DefaultMaxSubsetHintEntries; i++ {
		vals = append(vals, structpb.NewStringValue(fmt.Sprintf("10.%d.%d.%d:8000", i>>16, (i>>8)&255, i&255)))
	}
	m := withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex)
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{
		MetadataKeySubset: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
	g := ts.open(t, "unknown.example:9002", nil)
	g.send(m)
	code, body := immediateCode(t, g.recv())
	want := fmt.Sprintf("and %d more", DefaultMaxSubsetHintEntries-listSummaryEntries)
	if code != 503 || !strings.Contains(body, "owned by 2 pools") || !strings.Contains(body, want) || len(body) > 2048 {
		t.Fatalf("got %d, %d bytes: %.300s; want 503 naming the two owners, %q, at most 2 KiB", code, len(body), body, want)
	}
}

// TestRemovedPoolLeavesNoAccount: a stream that resolved its pool before
// the pool was removed and sends its body after keeps no account of the
// gone pool once it ends: no series of the pool is left in either limit.
func TestRemovedPoolLeavesNoAccount(t *testing.T) {
	f := newPools(t, 1, 1)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	accounts := func() int {
		n := 0
		for _, limit := range []string{limitConcurrentStreams, limitHeldBodyBytes} {
			n += fairShareSeries(t, ts, limit, poolNS(0), poolName(0))
		}
		return n
	}
	g := ts.open(t, authorityOf(0), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	eventually(t, "the stream charged to its pool", func() bool {
		return fairShareSeries(t, ts, limitConcurrentStreams, poolNS(0), poolName(0)) == 1
	})
	f.reg.Remove(f.pools[0].Key)
	g.send(reqBody(completionBody("m", 100), true))
	_, _ = g.stream.Recv() // whatever the answer for a gone pool, the stream ends after it
	g.cancel()
	eventually(t, "no account of the removed pool", func() bool {
		return accounts() == 0 && ts.srv.limits.streams.Total() == 0 && ts.srv.limits.held.Total() == 0
	})
}

// fairShareSeries counts the used series of limit for namespace/pool.
func fairShareSeries(t *testing.T, ts *testServer, limit, namespace, pool string) int {
	t.Helper()
	fams, err := ts.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		if f.GetName() != "poolpicker_fair_share_used" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["limit"] == limit && labels["namespace"] == namespace && labels["pool"] == pool {
				n++
			}
		}
	}
	return n
}
