// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/poolpicker/poolpicker/internal/eppclient"
)

// Case is one check of the picker's side of the contract.
type Case struct {
	Name string
	Part Part
	// MultiPool cases need a picker serving every pool of the namespace.
	MultiPool bool
	// Needs, when set, says why the options cannot run the case ("" when
	// they can).
	Needs func(Options) string
	Run   func(ctx context.Context, e *Env) error
}

// servedAbsentTexts are the failure texts a picker echoes when the gateway
// reports no served endpoint: no envoy.lb metadata at all, or the namespace
// without its key.
var servedAbsentTexts = []string{"fail: missing envoy lb metadata", "fail: missing destination endpoint served metadata"}

// Cases are the suite's cases, in the order they run.
func Cases() []Case {
	cs := []Case{
		{Name: "full-duplex stream routed, header equals envoy.lb metadata", Part: Protocol, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), Chunks: 3, Response: okResponse()})
			if err != nil {
				return err
			}
			if err := routedTo(res, e.pods, primaryPort); err != nil {
				return err
			}
			if res.DestinationIn != "request_headers" {
				return fmt.Errorf("destination set in the %s answer, want the request headers' answer", res.DestinationIn)
			}
			return nil
		}},
		{Name: "buffered stream: headers answered before the body, destination in the body answer", Part: Interop, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Shape: eppclient.Buffered, Authority: e.authority(PrimaryService), Body: completion(), Response: okResponse()})
			if err != nil {
				return err
			}
			return routedTo(res, e.pods, primaryPort)
		}},
		{Name: "NGINX Gateway Fabric shape (Value headers, x-epp-host, body, close)", Part: Interop, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Shape: eppclient.NGF, Authority: e.authority(PrimaryService), Body: completion(), Headers: []eppclient.Header{
				{Key: "x-epp-host", Value: PrimaryService + "." + e.opts.Namespace}, {Key: "x-epp-port", Value: strconv.Itoa(ServicePort)}}})
			if err != nil {
				return err
			}
			return routedTo(res, e.pods, primaryPort)
		}},
		{Name: "request without a body routed at its headers", Part: Interop, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Headers: []eppclient.Header{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}})
			if err != nil {
				return err
			}
			return routedTo(res, e.pods, primaryPort)
		}},
		{Name: "fallbacks: distinct endpoints of the pool, primary first", Part: Extension, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion()})
			if err != nil {
				return err
			}
			if err := routedTo(res, e.pods, primaryPort); err != nil {
				return err
			}
			eps := res.Endpoints()
			if len(eps) < 2 {
				return fmt.Errorf("%q: no fallback although the pool has %d endpoints", res.Destination, len(e.pods))
			}
			if len(slices.Compact(slices.Sorted(slices.Values(eps)))) != len(eps) {
				return fmt.Errorf("%q repeats an endpoint", res.Destination)
			}
			return nil
		}},
		{Name: "subset hint restricts the pick", Part: Protocol, Run: func(ctx context.Context, e *Env) error {
			return e.eachSelection(ctx, 1, func(sel []string, prompt int) eppclient.Request {
				return eppclient.Request{Authority: e.authority(PrimaryService), Body: completionOf(prompt), Subset: []string{addr(sel[0], primaryPort)}}
			})
		}},
		{Name: "subset hint with comma-joined entries inside one list entry", Part: Interop, Run: func(ctx context.Context, e *Env) error {
			return e.eachSelection(ctx, 2, func(sel []string, prompt int) eppclient.Request {
				joined := addr(sel[0], primaryPort) + "," + addr(sel[1], primaryPort)
				return eppclient.Request{Authority: e.authority(PrimaryService), Body: completionOf(prompt), Subset: []string{joined}}
			})
		}},
		{Name: "subset hint with nothing eligible answered 503", Part: Protocol, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), Subset: []string{"192.0.2.1:8000"}})
			return answeredStatus(res, err, 503)
		}},
		{Name: "served endpoint metadata accepted on the response path", Part: Protocol, Run: func(ctx context.Context, e *Env) error {
			r := okResponse()
			r.ServedPrimary = true
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), Response: r})
			if err != nil {
				return err
			}
			return routedTo(res, e.pods, primaryPort)
		}},
		{Name: "bad request body answered 400", Part: Extension, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: []byte(`{"model":`)})
			return refused(res, err, 400)
		}},
		{Name: "body over the limit answered 413", Part: Extension, Needs: func(o Options) string {
			if o.MaxBodyBytes == 0 {
				return "the picker's body limit is not given (Options.MaxBodyBytes)"
			}
			return ""
		}, Run: func(ctx context.Context, e *Env) error {
			body := []byte(`{"model":"m","prompt":"` + strings.Repeat("a", e.opts.MaxBodyBytes) + `"}`)
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: body, Chunks: 8})
			return refused(res, err, 413)
		}},
	}
	for n, ips := range []string{"one IP", "two IPs", "three IPs"} {
		n++
		cs = append(cs, Case{Name: "test-epp-endpoint-selection with " + ips, Part: SuiteBehaviour, Run: func(ctx context.Context, e *Env) error {
			return e.eachSelection(ctx, n, func(sel []string, prompt int) eppclient.Request {
				return eppclient.Request{Authority: e.authority(PrimaryService), Body: completionOf(prompt),
					Headers: []eppclient.Header{{Key: eppclient.HeaderTestSelection, Value: strings.Join(sel, ",")}}}
			})
		}})
	}
	cs = append(cs,
		Case{Name: "served endpoint echoed in x-conformance-test-served-endpoint", Part: SuiteBehaviour, Run: func(ctx context.Context, e *Env) error {
			r := okResponse()
			r.ServedPrimary = true
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), Response: r})
			if err != nil {
				return err
			}
			if got, want := res.ResponseHeaders[eppclient.HeaderTestServedResult], res.Endpoints()[0]; got != want {
				return fmt.Errorf("%s = %q, want %q", eppclient.HeaderTestServedResult, got, want)
			}
			return nil
		}},
		Case{Name: "served endpoint absent: the failure text echoed", Part: SuiteBehaviour, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), Response: okResponse()})
			if err != nil {
				return err
			}
			// The reference picker tells a response without the envoy.lb
			// namespace from one whose namespace lacks the key; either text
			// says the served endpoint is absent.
			got := res.ResponseHeaders[eppclient.HeaderTestServedResult]
			if !slices.Contains(servedAbsentTexts, got) {
				return fmt.Errorf("%s = %q, want one of %q", eppclient.HeaderTestServedResult, got, servedAbsentTexts)
			}
			return nil
		}},
		Case{Name: "data-parallel ip:port token picks that rank", Part: SuiteBehaviour, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			want := addr(e.dpPods[1], dpPorts[2])
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(DPService), Body: completion(),
				Headers: []eppclient.Header{{Key: eppclient.HeaderTestSelection, Value: want}}})
			if err != nil {
				return err
			}
			if got := res.Endpoints(); len(got) == 0 || got[0] != want {
				return fmt.Errorf("routed to %q, want %s", res.Destination, want)
			}
			return nil
		}},
	)
	for _, f := range authorityForms {
		cs = append(cs, Case{Name: "pool resolved from the " + f.gateway + " :authority", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			for _, p := range []struct {
				svc, pool string
				pods      []string
			}{{PrimaryService, PrimaryPool, e.pods}, {SecondService, SecondPool, e.secondPods}} {
				res, err := e.do(ctx, eppclient.Request{Authority: f.form(p.svc, e.opts.Namespace, ServicePort, p.pool), Body: completion()})
				if err != nil {
					return err
				}
				if err := routedTo(res, p.pods, primaryPort); err != nil {
					return fmt.Errorf("pool of Service %s: %w", p.svc, err)
				}
			}
			return nil
		}})
	}
	cs = append(cs,
		Case{Name: "three pools sharing pods on different ports", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			for i, port := range sharedPorts {
				res, err := e.do(ctx, eppclient.Request{Authority: e.authority(fmt.Sprintf("%s-%d-epp", SharedPoolPrefix, i)), Body: completion()})
				if err != nil {
					return err
				}
				if err := routedTo(res, e.pods, port); err != nil {
					return fmt.Errorf("pool %s-%d: %w", SharedPoolPrefix, i, err)
				}
			}
			return nil
		}},
		Case{Name: "two weighted pools: each stream to its own pool's pods", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			// A gateway splitting a route 3:1 between two pools interleaves
			// their streams; none may leak into the other pool.
			for i := 0; i < 16; i++ {
				svc, pods := PrimaryService, e.pods
				if i%4 == 3 {
					svc, pods = SecondService, e.secondPods
				}
				res, err := e.do(ctx, eppclient.Request{Authority: e.authority(svc), Body: completion(), Response: okResponse()})
				if err != nil {
					return err
				}
				if err := routedTo(res, pods, primaryPort); err != nil {
					return fmt.Errorf("stream %d to Service %s: %w", i, svc, err)
				}
			}
			return nil
		}},
		Case{Name: "explicit pool tag naming an unserved pool answered 404", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), PoolTag: e.opts.Namespace + "/no-such-pool"})
			return refused(res, err, 404)
		}},
		Case{Name: "explicit pool tag wins over the :authority", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(PrimaryService), Body: completion(), PoolTag: e.opts.Namespace + "/" + SecondPool})
			if err != nil {
				return err
			}
			return routedTo(res, e.secondPods, secondPort)
		}},
		Case{Name: "sheddable request on a pool of unknown load answered 429", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			// The objective reaches the picker through its watch: retry
			// until it applies (a routed answer means not yet).
			for {
				res, err := e.do(ctx, eppclient.Request{Authority: e.authority(UnscrapedService), Body: completion(),
					Headers: []eppclient.Header{{Key: "x-llm-d-inference-objective", Value: SheddableObjective}}})
				if err != nil || res.Immediate != nil {
					return refused(res, err, 429)
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("still routed to %q when the case timed out, want 429", res.Destination)
				case <-time.After(50 * time.Millisecond):
				}
			}
		}},
		Case{Name: "pool without ready endpoints answered 503", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority(EmptyService), Body: completion()})
			return refused(res, err, 503)
		}},
		Case{Name: "unknown :authority with many pools answered 503, not guessed", Part: Extension, MultiPool: true, Run: func(ctx context.Context, e *Env) error {
			res, err := e.do(ctx, eppclient.Request{Authority: e.authority("no-such-epp"), Body: completion()})
			return refused(res, err, 503)
		}},
	)
	for _, svc := range []string{"liveness", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor", ""} {
		cs = append(cs, Case{Name: fmt.Sprintf("health service %q SERVING", svc), Part: Interop, Needs: func(o Options) string {
			if o.HealthAddr == "" {
				return "no health address given"
			}
			return ""
		}, Run: func(ctx context.Context, e *Env) error {
			return eppclient.CheckServing(ctx, e.opts.HealthAddr, svc)
		}})
	}
	return cs
}

// authorityForms are the gateways' :authority forms (the resolution table
// of the site's Wire contracts page).
var authorityForms = []struct {
	gateway string
	form    func(svc, ns string, port int, pool string) string
}{
	{"Istio", func(svc, ns string, port int, _ string) string {
		return fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", port, svc, ns)
	}},
	{"kgateway", func(svc, ns string, port int, _ string) string { return fmt.Sprintf("%s.%s.svc:%d", svc, ns, port) }},
	{"agentgateway", func(svc, ns string, port int, _ string) string {
		return fmt.Sprintf("%s.%s.svc.cluster.local:%d", svc, ns, port)
	}},
	{"NGINX Gateway Fabric", func(svc, ns string, port int, _ string) string { return fmt.Sprintf("%s.%s:%d", svc, ns, port) }},
	{"Kubvernor", func(_, ns string, _ int, pool string) string { return fmt.Sprintf("chat_route-extsvc-%s.%s", ns, pool) }},
}

// selectionRepeats is how many requests eachSelection sends per selection.
const selectionRepeats = 3

// eachSelection checks that a constraint to n of the primary pool's pods
// holds: for each window of n consecutive pods (in a ring, so every pod is
// selected), it sends selectionRepeats requests of distinct prompts made by
// req and expects each routed into the window. One request could land
// there by chance, or because a prefix-affine picker stays where an
// earlier case sent the same prompt; every pod in turn, with fresh
// prompts, cannot.
func (e *Env) eachSelection(ctx context.Context, n int, req func(sel []string, prompt int) eppclient.Request) error {
	prompt := 0
	for first := range e.pods {
		var sel []string
		for i := range n {
			sel = append(sel, e.pods[(first+i)%len(e.pods)])
		}
		for range selectionRepeats {
			prompt++
			res, err := e.do(ctx, req(sel, prompt))
			if err != nil {
				return err
			}
			if err := routedTo(res, sel, primaryPort); err != nil {
				return fmt.Errorf("selecting %v (request %d): %w", sel, prompt, err)
			}
		}
		if n == len(e.pods) {
			break // one window is every pod
		}
	}
	return nil
}

// completionOf is a completion request whose prompt is numbered n, so that
// requests of distinct n share no prefix a picker could follow.
func completionOf(n int) []byte {
	return []byte(fmt.Sprintf(`{"model":"m","prompt":"%d selection %d"}`, n, n))
}

func (e *Env) do(ctx context.Context, req eppclient.Request) (*eppclient.Result, error) {
	res, err := e.client.Do(ctx, req)
	if err != nil {
		return res, fmt.Errorf("%s stream: %w", req.Shape, err)
	}
	return res, nil
}

func okResponse() *eppclient.Response {
	return &eppclient.Response{Status: 200, Body: []byte(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)}
}

func addr(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// routedTo checks that res routed to endpoints on port of the IPs ips, with
// the destination header and the envoy.lb metadata equal.
func routedTo(res *eppclient.Result, ips []string, port int) error {
	if res.Immediate != nil {
		return fmt.Errorf("answered %d: %s", res.Immediate.GetStatus().GetCode(), res.Immediate.GetBody())
	}
	if res.Destination == "" {
		return errors.New("no x-gateway-destination-endpoint header set")
	}
	if res.Metadata != res.Destination {
		return fmt.Errorf("header %q and envoy.lb metadata %q differ", res.Destination, res.Metadata)
	}
	for _, ep := range res.Endpoints() {
		host, p, err := net.SplitHostPort(ep)
		if err != nil || !slices.Contains(ips, host) || p != strconv.Itoa(port) {
			return fmt.Errorf("endpoint %q is not one of %v on port %d", ep, ips, port)
		}
	}
	return nil
}

// refused checks an ImmediateResponse with code and a JSON error body
// (poolpicker's answers; the protocol asks for the status only, see
// answeredStatus).
func refused(res *eppclient.Result, err error, code int) error {
	if err := answeredStatus(res, err, code); err != nil {
		return err
	}
	if b := bytes.TrimSpace(res.Immediate.GetBody()); len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("%d body %q is not a JSON error", code, res.Immediate.GetBody())
	}
	return nil
}

// answeredStatus checks an ImmediateResponse with code, whatever its body:
// what the protocol document asks of a picker that does not route.
func answeredStatus(res *eppclient.Result, err error, code int) error {
	if err != nil {
		if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.OK {
			return fmt.Errorf("stream ended with %v, want an ImmediateResponse %d", s, code)
		}
		return err
	}
	if res.Immediate == nil {
		return fmt.Errorf("routed to %q, want %d", res.Destination, code)
	}
	if got := int(res.Immediate.GetStatus().GetCode()); got != code {
		return fmt.Errorf("answered %d (%s), want %d", got, res.Immediate.GetBody(), code)
	}
	return nil
}
