// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func feed(u *usageReader, s string, chunk int) (Usage, bool) {
	for len(s) > 0 {
		n := min(chunk, len(s))
		u.write([]byte(s[:n]))
		s = s[n:]
	}
	return u.finish()
}

func TestUsageReader(t *testing.T) {
	bigJSON := `{"choices":[{"text":"` + strings.Repeat("x", maxJSONResponseHold) + `"}],"usage":{"prompt_tokens":9,"completion_tokens":8}}`
	bigJSONCached := `{"choices":[{"text":"` + strings.Repeat("x", maxJSONResponseHold) + `"}],"usage":{"prompt_tokens":9,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}`
	var sse strings.Builder
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&sse, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}],\"usage\":null}\n\n", i)
	}
	sse.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2000,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n")
	cases := []struct {
		name string
		sse  bool
		body string
		want Usage
		ok   bool
	}{
		{"json", false, `{"usage":{"prompt_tokens":1,"completion_tokens":2}}`, Usage{PromptTokens: 1, CompletionTokens: 2}, true},
		{"json no usage", false, `{"x":1}`, Usage{}, false},
		{"json cached tokens", false, `{"usage":{"prompt_tokens":1540,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":1488}}}`, Usage{PromptTokens: 1540, CompletionTokens: 30, CachedTokens: 1488, HasCachedTokens: true}, true},
		{"json cached tokens zero", false, `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`, Usage{PromptTokens: 5, CompletionTokens: 1, HasCachedTokens: true}, true},
		{"json details null", false, `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`, Usage{PromptTokens: 5, CompletionTokens: 1}, true},
		{"json details without cached", false, `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"audio_tokens":0}}}`, Usage{PromptTokens: 5, CompletionTokens: 1}, true},
		{"json cached tokens wrong type", false, `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":"x"}}}`, Usage{}, false},
		{"json larger than the hold, cached", false, bigJSONCached, Usage{PromptTokens: 9, CompletionTokens: 8, CachedTokens: 4, HasCachedTokens: true}, true},
		{"json larger than the hold", false, bigJSON, Usage{PromptTokens: 9, CompletionTokens: 8}, true},
		{"sse", true, sse.String(), Usage{PromptTokens: 30, CompletionTokens: 2000, CachedTokens: 16, HasCachedTokens: true}, true},
		{"sse crlf, no final newline", true, "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}", Usage{PromptTokens: 5, CompletionTokens: 6}, true},
		{"sse usage after DONE ignored", true, "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\ndata: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":7}}\n\n", Usage{PromptTokens: 3, CompletionTokens: 4}, true},
		{"sse huge line skipped", true, "data: " + strings.Repeat("y", maxSSELineBytes+10) + "\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n", Usage{PromptTokens: 1, CompletionTokens: 1}, true},
	}
	for _, c := range cases {
		for _, chunk := range []int{1 << 20, 4096, 7} {
			if chunk == 7 && len(c.body) > 1<<16 {
				continue
			}
			t.Run(fmt.Sprintf("%s/%d", c.name, chunk), func(t *testing.T) {
				u := &usageReader{sse: c.sse}
				got, ok := feed(u, c.body, chunk)
				if ok != c.ok || got != c.want {
					t.Fatalf("got %+v %v, want %+v %v", got, ok, c.want, c.ok)
				}
				if cap(u.buf) > maxJSONResponseHold+maxSSELineBytes+(1<<20) {
					t.Fatalf("held %d bytes", cap(u.buf))
				}
			})
		}
	}
}

// TestUsageMetrics runs JSON and SSE responses through the server and
// checks the token histograms and the request duration.
func TestUsageMetrics(t *testing.T) {
	f := newPools(t, 2, 2)
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	run := func(contentType string, chunks []string) {
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), duplex, duplex))
		g.send(reqBody([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`), true))
		g.recv()
		g.recv()
		g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", contentType, true}}, false, ""))
		g.recv()
		for i, c := range chunks {
			g.send(respBody([]byte(c), i == len(chunks)-1))
			g.recv()
		}
		g.expectEOF()
	}
	run("application/json", []string{`{"usage":{"prompt_tokens":`, `10,"completion_tokens":20}}`})
	run("text/event-stream", []string{"data: {\"choices\":[{\"delta\":{}}]}\n\nda", "ta: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":200}}\n", "\ndata: [DONE]\n\n"})
	if in, out := metricSum(ts.srv.metrics.inputTokens), metricSum(ts.srv.metrics.outputTokens); in != 110 || out != 220 {
		t.Fatalf("token sums in=%v out=%v, want 110 and 220", in, out)
	}
	if n := metricCount(ts.srv.metrics.duration); n != 2 {
		t.Fatalf("duration observations %d", n)
	}
	if f.totalInFlight() != 0 {
		t.Fatal("in-flight left")
	}
}

// FuzzUsageReader holds the usage reader to the same answer whatever the
// chunking, and never panics on a malformed body.
func FuzzUsageReader(f *testing.F) {
	f.Add(`{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}`, false, uint8(5))
	f.Add("data: {\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":null}}\n\ndata: [DONE]\n\n", true, uint8(3))
	f.Add("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":-1}}}\r\n", true, uint8(1))
	f.Fuzz(func(t *testing.T, body string, sse bool, chunk uint8) {
		whole, wholeOK := feed(&usageReader{sse: sse}, body, len(body)+1)
		pieces, piecesOK := feed(&usageReader{sse: sse}, body, int(chunk)+1)
		if whole != pieces || wholeOK != piecesOK {
			t.Fatalf("whole %+v %v, in pieces of %d %+v %v", whole, wholeOK, int(chunk)+1, pieces, piecesOK)
		}
		if !wholeOK && whole != (Usage{}) {
			t.Fatalf("no usage but %+v", whole)
		}
	})
}

// TestLatencyMetrics: a streamed response records its time to first byte
// (TTFT) and its time per output token after the first (TPOT), between the
// bounds the gateway's own clock puts on them; a response not streamed (not
// text/event-stream) records neither. Every scheduling attempt is counted, a success with the
// pod picked and a failure with none.
func TestLatencyMetrics(t *testing.T) {
	f := newPools(t, 1, 2)
	f.add(1, poolNS(1), poolName(1), poolSvc(1), 9002, 0) // no pods: the attempt fails
	ts := startServer(t, f.reg, leastInFlight{}, Options{Insecure: true})
	const firstGap, restGap = 30 * time.Millisecond, 40 * time.Millisecond
	exchange := func(stream bool) (total time.Duration) {
		start := time.Now()
		g := ts.open(t, authorityOf(0), nil)
		g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/chat/completions"), false), duplex, duplex))
		g.send(reqBody([]byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%v}`, stream)), true))
		g.recv()
		g.recv()
		contentType := "application/json"
		if stream {
			contentType = "text/event-stream"
		}
		g.send(respHeaders([]hdr{{":status", "200", true}, {"content-type", contentType, true}}, false, ""))
		g.recv()
		// The model server's time to first token, then to the rest: what
		// is measured is time passing, so the test lets it pass.
		time.Sleep(firstGap)
		g.send(respBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"), false))
		g.recv()
		time.Sleep(restGap)
		g.send(respBody([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n"), true))
		g.recv()
		g.expectEOF()
		return time.Since(start)
	}
	total := exchange(true)
	if n := metricCount(ts.srv.metrics.ttft); n != 1 {
		t.Fatalf("%d TTFT observations, want 1", n)
	}
	if got := metricSum(ts.srv.metrics.ttft); got < firstGap.Seconds() || got > total.Seconds() {
		t.Errorf("TTFT %.3fs, want between the %s before the first byte and the %s of the whole exchange", got, firstGap, total)
	}
	// 5 completion tokens: the 4 after the first came in at least restGap.
	if got := metricSum(ts.srv.metrics.tpot); got < restGap.Seconds()/4 || got > (total-firstGap).Seconds()/4 {
		t.Errorf("TPOT %.4fs, want between %.4fs and %.4fs", got, restGap.Seconds()/4, (total-firstGap).Seconds()/4)
	}
	exchange(false)
	if n, m := metricCount(ts.srv.metrics.ttft), metricCount(ts.srv.metrics.tpot); n != 1 || m != 1 {
		t.Errorf("a response not streamed was recorded: TTFT observations %d, TPOT %d, want 1 and 1", n, m)
	}

	g := ts.open(t, authorityOf(1), nil)
	g.send(withProtocol(reqHeaders(envoyHeaders("POST", "/v1/completions"), false), duplex, duplex))
	g.send(reqBody([]byte(`{"model":"m","prompt":"hi"}`), true))
	if code, _ := immediateCode(t, g.recv()); code != http.StatusServiceUnavailable {
		t.Fatalf("a pool without endpoints answered %d, want 503", code)
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"success", "m", poolName(0) + "-pod-0", poolNS(0), "8000", poolName(0)}, 2},
		{[]string{"failure", "m", "", poolNS(1), "", poolName(1)}, 1}, // the tenant's namespace, though no pod was picked
	} {
		if got := testutil.ToFloat64(ts.srv.metrics.attempts.WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("scheduler attempts %v = %v, want %v", c.labels, got, c.want)
		}
	}
}
