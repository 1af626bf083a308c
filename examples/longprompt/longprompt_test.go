// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package longprompt_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"

	"example.com/longprompt"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

func TestFactory(t *testing.T) {
	cases := []struct {
		name, params string
		want         int // PromptBytes
		wantErr      string
	}{
		{"defaults", "", longprompt.DefaultMinPromptBytes, ""},
		{"threshold", `{"minPromptBytes": 100, "label": "gpu/long"}`, 100, ""},
		{"negative threshold", `{"minPromptBytes": -1}`, 0, "minPromptBytes -1 must be at least 1"},
		{"unknown parameter", `{"minPromptByte": 100}`, 0, `unknown field "minPromptByte"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := longprompt.New("x", json.RawMessage(c.params), framework.NewHandle(t.Context(), logr.Discard(), nil))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.(*longprompt.Scorer).PromptBytes(); got != c.want {
				t.Fatalf("PromptBytes %d, want %d", got, c.want)
			}
		})
	}
	// A second registration of the type is refused.
	r := plugins(t)
	if err := r.Register(longprompt.Type, longprompt.New); err == nil {
		t.Fatal("registering the type again succeeded")
	}
	o := scheduling.Options{Registry: r, ConfigText: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: long-prompt-scorer\n  parameters: {minPromptBytes: -5}\n"}
	if _, err := o.LoadConfig(); err == nil || !strings.Contains(err.Error(), "long-prompt-scorer") {
		t.Fatalf("a bad parameter in a config: %v, want an error naming the plugin", err)
	}
}

// plugins are the built-in plugins and long-prompt-scorer, as
// app.WithPlugin(longprompt.Type, longprompt.New) makes them.
func plugins(t *testing.T) *framework.Registry {
	t.Helper()
	r := scheduling.NewRegistry()
	if err := r.Register(longprompt.Type, longprompt.New); err != nil {
		t.Fatal(err)
	}
	return r
}

const (
	pickerService = "epp"
	pickerPort    = 9002
	longLabel     = "poolpicker.example/long-context"
)

// pool is a pool of three endpoints, the second one's pod labelled long
// context, each with the same fresh metrics.
func pool(t *testing.T) (*datastore.Registry, []*datastore.Endpoint) {
	t.Helper()
	reg := datastore.NewRegistry()
	p := reg.Upsert(types.NamespacedName{Namespace: "ns", Name: "pool"}, &datastore.PoolSpec{
		Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}, PickerService: pickerService, PickerPort: pickerPort,
	})
	var pods []datastore.EndpointSource
	for i := 1; i <= 3; i++ {
		labels := map[string]string{"app": "m"}
		if i == 2 {
			labels[longLabel] = "true"
		}
		pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)},
			UID: types.UID(fmt.Sprintf("uid-%d", i)), IP: fmt.Sprintf("127.0.0.%d", 10+i), Labels: labels})
	}
	p.SetPods(pods)
	p.SetSynced(true)
	eps := p.Endpoints().Endpoints
	for _, e := range eps {
		e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.1, ScrapedAt: time.Now().Add(time.Hour)})
	}
	return reg, eps
}

// server serves ext_proc for reg over a loopback socket with a scheduler
// built from the config file at path (empty: the default config), and
// returns a client connection whose authority names the pool's picker.
func server(t *testing.T, reg *datastore.Registry, path string) (*scheduling.Scheduler, *grpc.ClientConn) {
	t.Helper()
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(1, 2))
	sched, err := scheduling.New(nil, scheduling.Options{ConfigFile: path, Registry: plugins(t), Rand: func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return rnd.Uint64()
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg.AddObserver(sched)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extproc.New(reg, sched, extproc.Options{Insecure: true, GRPCListener: lis, HealthListener: hlis})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority(fmt.Sprintf("%s.ns.svc:%d", pickerService, pickerPort)), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return sched, conn
}

// pick sends a chat request with a prompt of about n bytes over one
// ext_proc stream, as an Envoy gateway in full-duplex mode does, and
// returns the primary endpoint the picker chose.
func pick(t *testing.T, conn *grpc.ClientConn, topic string, n int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	content := topic + strings.Repeat(" and more", n/9)
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": content}}})
	if err != nil {
		t.Fatal(err)
	}
	var headers []*corev3.HeaderValue
	for _, h := range [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "gateway.example.com"}, {":scheme", "http"}, {"content-type", "application/json"}} {
		headers = append(headers, &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])})
	}
	duplex := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: duplex, ResponseBodyMode: duplex}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ir := resp.GetImmediateResponse(); ir != nil {
		t.Fatalf("picker refused the request: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	for _, o := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if o.GetHeader().GetKey() == extproc.HeaderDestination {
			// The primary endpoint, then the fallbacks.
			primary, _, _ := strings.Cut(string(o.GetHeader().GetRawValue()), ",")
			return primary
		}
	}
	t.Fatalf("no %s in %v", extproc.HeaderDestination, resp)
	return ""
}

// TestConfigFileChangesPicks enables the scorer from a config file and
// drives a real ext_proc server over gRPC: long prompts go to the labelled
// endpoint and short ones elsewhere, where the default config spreads them.
// The threshold (20,000 bytes) lies past the 16 KiB of prompt the default
// scorers read: the server hands the scorer the prompt it asks for
// (framework.PromptReader), or every prompt would look short.
func TestConfigFileChangesPicks(t *testing.T) {
	const long, short, distinct = 30000, 1000, 8
	reg, eps := pool(t)
	labelled := eps[1].Address
	if eps[1].Labels[longLabel] != "true" {
		t.Fatalf("endpoint %s is not the labelled pod", labelled)
	}

	sched, conn := server(t, reg, "testdata/config.yaml")
	if got := sched.PromptBytes(); got != 20000 {
		t.Fatalf("scheduler reads %d bytes of prompt, want the scorer's 20000", got)
	}
	for i := range distinct {
		if got := pick(t, conn, fmt.Sprintf("long %d", i), long); got != labelled {
			t.Fatalf("long prompt %d went to %s, want the long-context endpoint %s", i, got, labelled)
		}
		if got := pick(t, conn, fmt.Sprintf("short %d", i), short); got == labelled {
			t.Fatalf("short prompt %d went to the long-context endpoint", i)
		}
	}

	// Without the plugin, the same long prompts do not all go there.
	reg, eps = pool(t)
	_, conn = server(t, reg, "")
	toLabelled := 0
	for i := range distinct {
		if pick(t, conn, fmt.Sprintf("long %d", i), long) == eps[1].Address {
			toLabelled++
		}
	}
	if toLabelled == distinct {
		t.Fatalf("the default config sent all %d long prompts to the labelled endpoint too", distinct)
	}
}
