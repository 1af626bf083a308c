// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/kvevents"
)

// HeaderServer is the response header naming the server that answered
// (Options.Name), so clients and tests can see where a request landed.
const HeaderServer = "x-modelsim-server"

// maxBodyBytes bounds request bodies; larger ones are answered 413.
const maxBodyBytes = 16 << 20

// Server is one simulated model server. Create it with New, then Start it;
// Stop ends it abruptly (like a killed process), Shutdown gracefully.
type Server struct {
	opts    Options
	eng     *engine
	handler http.Handler
	idSeq   atomic.Uint64

	mu      sync.Mutex
	started bool
	closed  bool
	ln      net.Listener
	srv     *http.Server
	// handlers counts running handler calls, so Stop returns only when none
	// is left; Add happens under mu while not closed.
	handlers sync.WaitGroup
	// baseCancel ends every request context when the server stops.
	baseCancel context.CancelFunc
	// served is closed when Serve has returned.
	served chan struct{}
	// done is closed when the server has stopped.
	done chan struct{}
	// hasher keys prompt blocks when KV events are on.
	hasher *kvevents.Hasher
}

// New checks the options and builds a server; it does not listen yet.
func New(opts Options) (*Server, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.LoRAAdapters = slices.Clone(opts.LoRAAdapters)
	s := &Server{opts: opts, eng: newEngine(&opts), done: make(chan struct{})}
	if opts.KVEvents != nil {
		h, err := kvevents.NewHasher(opts.BlockSizeTokens, opts.KVEvents.HashSeed, kvevents.HashCBORFNV)
		if err != nil {
			return nil, err
		}
		s.hasher = h
		s.eng.kv.record = true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, false) }))
	mux.HandleFunc("/v1/chat/completions", s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, true) }))
	mux.HandleFunc("/tokenize", s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveTokens(w, r, "", "tokens") }))
	mux.HandleFunc("/v1/completions/render", s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveTokens(w, r, "completion", "token_ids") }))
	mux.HandleFunc("/v1/chat/completions/render", s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveTokens(w, r, "chat", "token_ids") }))
	mux.HandleFunc("/v1/models", s.method(http.MethodGet, s.serveModels))
	mux.HandleFunc("/metrics", s.method(http.MethodGet, s.serveMetrics))
	mux.HandleFunc("/health", s.method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{code: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})
	s.handler = mux
	return s, nil
}

// Start listens (Options.Listener or Options.Addr) and serves in the
// background until ctx ends or Stop or Shutdown is called. It returns once
// the server accepts connections.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("modelsim: server already started")
	}
	ln := s.opts.Listener
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", s.opts.Addr)
		if err != nil {
			return fmt.Errorf("modelsim: listen on %s: %w", s.opts.Addr, err)
		}
	}
	if s.opts.Name == "" {
		s.opts.Name = ln.Addr().String()
	}
	base, cancel := context.WithCancel(context.Background())
	if o := s.opts.KVEvents; o != nil {
		pub, err := startKVPublisher(base, *o, s.opts.BlockSizeTokens, "kv@"+ln.Addr().String()+"@"+s.opts.Model)
		if err != nil {
			cancel()
			if s.opts.Listener == nil {
				_ = ln.Close()
			}
			return err
		}
		s.eng.pub = pub
	}
	s.started, s.ln, s.baseCancel = true, ln, cancel
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.track),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	s.served = make(chan struct{})
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	go func() {
		select {
		case <-ctx.Done():
			s.Stop()
		case <-s.done:
		}
	}()
	s.opts.Logger.V(2).Info("model server simulator listening", "addr", ln.Addr().String(), "model", s.opts.Model, "adapters", s.opts.LoRAAdapters)
	return nil
}

// Addr is the address the server listens on ("" before Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Name is the server's name in the x-modelsim-server header.
func (s *Server) Name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Name
}

// Stop closes the listener and every connection at once, cancels the requests
// in progress and returns when their handlers have ended. Clients see their
// connections reset, as when a model server's process dies.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.closed = true
	if !s.started {
		// A server never started cannot start later.
		s.started = true
		s.mu.Unlock()
		close(s.done)
		return
	}
	s.mu.Unlock()
	// Connections go first, so that no handler gets to end its response
	// cleanly: clients see what a dead process leaves them.
	_ = s.srv.Close()
	s.baseCancel()
	<-s.served
	s.handlers.Wait()
	if s.eng.pub != nil {
		<-s.eng.pub.done
	}
	close(s.done)
}

// Shutdown stops accepting connections and waits, at most until ctx ends, for
// requests in progress to finish; then it stops like Stop.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, closed := s.srv, s.closed
	s.mu.Unlock()
	if srv == nil || closed {
		s.Stop()
		return nil
	}
	err := srv.Shutdown(ctx)
	s.Stop()
	return err
}

// KVEventsPending reports whether the server has recorded KV events not
// yet numbered into a published batch. A request's events are recorded
// before its response; they are published a moment later, so a test that
// waits for a request's events to be received waits for this to be false
// first, then for the batches KVEventBatches counts.
func (s *Server) KVEventsPending() bool {
	if s.eng.pub == nil {
		return false
	}
	s.eng.pub.mu.Lock()
	defer s.eng.pub.mu.Unlock()
	return len(s.eng.pub.pending) > 0
}

// KVEventsAddr is the address the KV-event PUB socket listens on, and
// KVReplayAddr its replay socket's ("" when none or before Start).
func (s *Server) KVEventsAddr() string {
	if s.eng.pub == nil {
		return ""
	}
	return s.eng.pub.addr()
}

// KVEventBatches is the number of KV-event batches the server published
// (the last sequence number), 0 without KV events.
func (s *Server) KVEventBatches() uint64 {
	if s.eng.pub == nil {
		return 0
	}
	s.eng.pub.mu.Lock()
	defer s.eng.pub.mu.Unlock()
	return s.eng.pub.seq
}

// KVReplayAddr is the address of the KV-event replay socket; see KVEventsAddr.
func (s *Server) KVReplayAddr() string {
	if s.eng.pub == nil {
		return ""
	}
	return s.eng.pub.replayAddr()
}

// serveTokens answers vLLM's /tokenize (kind "": a completion prompt or chat
// messages, tokens under "tokens") and render endpoints (kind "completion"
// or "chat", tokens under "token_ids") with the simulator's token ids of
// the prompt the inference endpoint would read.
func (s *Server) serveTokens(w http.ResponseWriter, r *http.Request, kind, field string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, badRequest("reading the request body: %v", err))
		return
	}
	chat := kind == "chat"
	if kind == "" {
		var probe struct {
			Messages json.RawMessage `json:"messages"`
		}
		_ = json.Unmarshal(body, &probe)
		chat = len(probe.Messages) > 0 && string(probe.Messages) != "null"
	}
	req, apiErr := parseRequest(body, chat, s.opts.DefaultMaxTokens)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if _, ok := s.adapterOf(req.model); !ok {
		writeError(w, &apiError{code: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The model `%s` does not exist.", req.model)})
		return
	}
	tokens := promptTokenIDs(req.prompt, s.opts.PromptBytesPerToken)
	out := map[string]any{field: tokens}
	if field == "tokens" {
		out["count"] = len(tokens)
		out["max_model_len"] = s.opts.MaxModelLenTokens
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// Options returns the server's options, defaults filled in.
func (s *Server) Options() Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.opts
	o.LoRAAdapters = slices.Clone(o.LoRAAdapters)
	o.Listener = nil
	return o
}

// Done is closed when the server has stopped.
func (s *Server) Done() <-chan struct{} { return s.done }

// Stats returns the server's counters.
func (s *Server) Stats() Stats { return s.eng.snapshot() }

// State returns what the server reports on /metrics now.
func (s *Server) State() vllmpage.State { return s.eng.state(s.opts.MaxLoRAs) }

// LoadedAdapters returns the LoRA adapters holding slots, least recently used
// first.
func (s *Server) LoadedAdapters() []string { return s.eng.loadedAdapters() }

func (s *Server) track(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, &apiError{code: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: "server stopping"})
		return
	}
	s.handlers.Add(1)
	name := s.opts.Name
	s.mu.Unlock()
	defer s.handlers.Done()
	w.Header().Set(HeaderServer, name)
	s.handler.ServeHTTP(w, r)
}

func (s *Server) method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m {
			w.Header().Set("Allow", m)
			writeError(w, &apiError{code: http.StatusMethodNotAllowed, typ: "MethodNotAllowed", msg: fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, m)})
			return
		}
		h(w, r)
	}
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.code)
	_ = json.NewEncoder(w).Encode(errorBody{Error: errorDetail{Message: e.msg, Type: e.typ, Code: e.code}})
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	created := time.Now().Unix()
	list := modelList{Object: "list", Data: []modelCard{{
		ID: s.opts.Model, Object: "model", Created: created, OwnedBy: "vllm", Root: s.opts.Model, MaxModelLen: s.opts.MaxModelLenTokens,
	}}}
	for _, a := range s.opts.LoRAAdapters {
		parent := s.opts.Model
		list.Data = append(list.Data, modelCard{ID: a, Object: "model", Created: created, OwnedBy: "vllm", Root: a, Parent: &parent, MaxModelLen: s.opts.MaxModelLenTokens})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	page, err := vllmpage.Page(s.State(), vllmpage.Options{
		Engine: vllmpage.VLLM, Model: s.opts.Model, MinBytes: s.opts.MetricsPageBytes, Seed: s.opts.Seed,
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(page) // a scraper that went away is not an error here
}

// adapterOf maps a requested model to its LoRA adapter ("" for the base
// model); ok is false for a model the server does not serve.
func (s *Server) adapterOf(model string) (adapter string, ok bool) {
	if model == s.opts.Model {
		return "", true
	}
	if slices.Contains(s.opts.LoRAAdapters, model) {
		return model, true
	}
	return "", false
}

func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, &apiError{code: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: fmt.Sprintf("request body larger than %d bytes", maxBodyBytes)})
			return
		}
		writeError(w, badRequest("reading the request body: %v", err))
		return
	}
	req, apiErr := parseRequest(body, chat, s.opts.DefaultMaxTokens)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if bpt := s.opts.PromptBytesPerToken; bpt != BytesPerToken {
		req.promptTokens = (len(req.prompt) + bpt - 1) / bpt
	}
	adapter, ok := s.adapterOf(req.model)
	if !ok {
		writeError(w, &apiError{code: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The model `%s` does not exist.", req.model)})
		return
	}
	if total := req.promptTokens + req.maxTokens; total > s.opts.MaxModelLenTokens {
		writeError(w, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			s.opts.MaxModelLenTokens, total, req.promptTokens, req.maxTokens))
		return
	}
	seq := &sequence{
		model:        req.model,
		adapter:      adapter,
		promptTokens: req.promptTokens,
		totalBlocks:  (req.promptTokens + req.maxTokens + s.opts.BlockSizeTokens - 1) / s.opts.BlockSizeTokens,
	}
	switch {
	case s.opts.DisablePrefixCaching:
	case s.hasher != nil:
		tokens := promptTokenIDs(req.prompt, s.opts.PromptBytesPerToken)
		for _, k := range s.hasher.Keys(nil, s.hasher.Root(req.model), tokens) {
			seq.hashes = append(seq.hashes, blockHash(k))
		}
		seq.meta = &blockMeta{tokens: tokens, loraName: adapter}
	default:
		seq.hashes = promptBlockHashes(req.model, req.prompt, s.opts.BlockSizeTokens, s.opts.PromptBytesPerToken)
	}
	ctx := r.Context()
	if err := s.eng.run(ctx, seq); err != nil {
		return // the client went away while queued
	}
	gen := newGeneration(s.opts.Seed, req.model, req.prompt, req.maxTokens, req.explicit, s.opts.Jitter)
	out := &responder{s: s, w: w, req: req, gen: gen, id: s.newID(chat), created: time.Now().Unix(),
		usage: usage{PromptTokens: req.promptTokens, CompletionTokens: len(gen.words), TotalTokens: req.promptTokens + len(gen.words),
			PromptTokensDetails: &promptDetail{CachedTokens: seq.alloc.cachedTokens}}}
	completed := s.decode(ctx, seq, gen, out) == nil
	s.eng.finish(seq, completed)
	s.opts.Logger.V(4).Info("request served", "request", r.Header.Get("x-request-id"), "model", req.model,
		"promptTokens", req.promptTokens, "cachedTokens", seq.alloc.cachedTokens, "outputTokens", len(gen.words), "completed", completed)
}

func (s *Server) newID(chat bool) string {
	n := s.idSeq.Add(1)
	h := xxhash.Sum64String(fmt.Sprintf("%d/%s/%d", s.opts.Seed, s.opts.Name, n))
	if chat {
		return fmt.Sprintf("chatcmpl-%016x", h)
	}
	return fmt.Sprintf("cmpl-%016x", h)
}

// stepTime is how long a step of single-sequence duration d takes with the
// current number of running sequences.
func (s *Server) stepTime(d time.Duration, g *generation) time.Duration {
	if d <= 0 {
		return 0
	}
	slow := 1.0
	if s.opts.LoadSlowdown > 0 {
		slow += s.opts.LoadSlowdown * float64(max(0, s.eng.runningCount()-1))
	}
	return time.Duration(float64(d) * slow * g.factor() / s.opts.TimeScale)
}

// decode spends the prefill time of the uncached prompt tokens (plus an
// adapter load), then emits one token per decode step. It returns ctx's
// error when the client goes away, or the write error. Steps are laid end
// to end from the moment the engine admitted the request: a wake-up the
// host's scheduler delays shortens the next wait instead of delaying every
// later token, so a busy machine (or a large TimeScale) does not stretch
// simulated time or cut the server's throughput.
func (s *Server) decode(ctx context.Context, seq *sequence, gen *generation, out *responder) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	deadline := seq.admittedAt
	wait := func(d time.Duration) error {
		deadline = deadline.Add(d)
		d = time.Until(deadline)
		if d <= 0 {
			return ctx.Err()
		}
		timer.Reset(d)
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	prefill := s.stepTime(s.opts.PrefillOverhead+time.Duration(seq.promptTokens-seq.alloc.cachedTokens)*max(s.opts.PrefillPerToken, 0), gen)
	if seq.loadedAdapter && s.opts.LoRALoadLatency > 0 {
		prefill += time.Duration(float64(s.opts.LoRALoadLatency) / s.opts.TimeScale)
	}
	if err := wait(prefill); err != nil {
		return err
	}
	if err := out.begin(); err != nil {
		return err
	}
	for i := range gen.words {
		if i > 0 {
			if err := wait(s.stepTime(s.opts.DecodePerToken, gen)); err != nil {
				return err
			}
		}
		if err := out.token(i); err != nil {
			return err
		}
	}
	return out.end()
}

// responder writes a response whole (JSON) or as server-sent events.
type responder struct {
	s       *Server
	w       http.ResponseWriter
	req     *parsedRequest
	gen     *generation
	id      string
	created int64
	usage   usage
	text    strings.Builder
	flusher http.Flusher
}

func (o *responder) object() string {
	switch {
	case o.req.chat && o.req.stream:
		return "chat.completion.chunk"
	case o.req.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (o *responder) begin() error {
	if !o.req.stream {
		return nil
	}
	o.w.Header().Set("Content-Type", "text/event-stream")
	o.w.Header().Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	o.flusher, _ = o.w.(http.Flusher)
	if o.req.chat {
		return o.event(response{ID: o.id, Object: o.object(), Created: o.created, Model: o.req.model,
			Choices: []chatChoice{{Delta: &chatContent{Role: "assistant"}}}})
	}
	return nil
}

func (o *responder) token(i int) error {
	tok := o.gen.token(i)
	if !o.req.stream {
		o.text.WriteString(tok)
		return nil
	}
	var finish *string
	if i == len(o.gen.words)-1 {
		finish = &o.gen.finish
	}
	r := response{ID: o.id, Object: o.object(), Created: o.created, Model: o.req.model}
	if o.req.chat {
		r.Choices = []chatChoice{{Delta: &chatContent{Content: tok}, FinishReason: finish}}
	} else {
		r.Choices = []completionChoice{{Text: tok, FinishReason: finish}}
	}
	return o.event(r)
}

func (o *responder) end() error {
	if o.req.stream {
		if o.req.includeUsage {
			u := o.usage
			if err := o.event(response{ID: o.id, Object: o.object(), Created: o.created, Model: o.req.model, Choices: []any{}, Usage: &u}); err != nil {
				return err
			}
		}
		return o.write([]byte("data: [DONE]\n\n"))
	}
	r := response{ID: o.id, Object: o.object(), Created: o.created, Model: o.req.model, Usage: &o.usage}
	if o.req.chat {
		r.Choices = []chatChoice{{Message: &chatContent{Role: "assistant", Content: o.text.String()}, FinishReason: &o.gen.finish}}
	} else {
		r.Choices = []completionChoice{{Text: o.text.String(), FinishReason: &o.gen.finish}}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	o.w.Header().Set("Content-Type", "application/json")
	_, err = o.w.Write(append(b, '\n'))
	return err
}

func (o *responder) event(r response) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	return o.write(buf)
}

func (o *responder) write(b []byte) error {
	if _, err := o.w.Write(b); err != nil {
		return err
	}
	if o.flusher != nil {
		o.flusher.Flush()
	}
	return nil
}
