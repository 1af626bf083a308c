// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"context"
	"fmt"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/requestbody/requestbodytest"
	"github.com/poolpicker/poolpicker/scheduling"
)

// replayStream is an ext_proc stream held in memory: it hands the server
// a recorded request and counts the answers. It measures the server's own
// work per request without the transport; bench/extproc measures the round
// trip over real gRPC.
type replayStream struct {
	grpc.ServerStream
	ctx     context.Context
	msgs    []*extprocv3.ProcessingRequest
	next    int
	answers int
	dest    string
}

func (r *replayStream) Context() context.Context { return r.ctx }

func (r *replayStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if r.next == len(r.msgs) {
		return nil, io.EOF
	}
	r.next++
	return r.msgs[r.next-1], nil
}

func (r *replayStream) Send(resp *extprocv3.ProcessingResponse) error {
	if r.answers == 0 {
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == HeaderDestination {
				r.dest = string(h.GetHeader().GetRawValue())
			}
		}
	}
	r.answers++
	return nil
}

// BenchmarkProcess runs the server's handler on a chat request streamed in
// 16 KiB chunks (FULL_DUPLEX_STREAMED), as bench/extproc sends it, with the
// default scheduler over 50 pools of 8 endpoints; scores=true adds the
// endpoints' scores to the answer (--emit-endpoint-scores).
func BenchmarkProcess(b *testing.B) {
	for _, c := range []struct {
		size   int
		scores bool
	}{{1 << 10, false}, {64 << 10, false}, {1 << 10, true}} {
		size := c.size
		name := fmt.Sprintf("body=%dKiB", size>>10)
		if c.scores {
			name += "/scores=true"
		}
		b.Run(name, func(b *testing.B) {
			srv := benchServer(b, Options{EmitEndpointScores: c.scores})
			body := requestbodytest.ChatBody(size, false)
			msgs := []*extprocv3.ProcessingRequest{{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
				Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
					{Key: ":authority", RawValue: []byte("gw.example")}, {Key: "content-type", RawValue: []byte("application/json")},
					{Key: "content-length", RawValue: []byte(fmt.Sprint(len(body)))}}}}},
			}}
			for off := 0; off < len(body); off += 16 << 10 {
				end := min(off+16<<10, len(body))
				msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}})
			}
			ctxs := benchContexts()
			b.ReportAllocs()
			errc := make(chan error)
			i := 0
			for b.Loop() {
				st := &replayStream{ctx: ctxs[i%len(ctxs)], msgs: msgs}
				// A new goroutine per stream, with a new goroutine's stack,
				// as gRPC runs each stream.
				go func() { errc <- srv.Process(st) }()
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
				if st.dest == "" || st.answers != len(msgs) {
					b.Fatalf("destination %q after %d answers, want one and %d answers", st.dest, st.answers, len(msgs))
				}
				i++
			}
		})
	}
}

// benchServer is a server with the default scheduler over 50 pools of 8
// endpoints (pool i: Service epp-i in namespace ns-(i%10)).
func benchServer(b *testing.B, opts Options) *Server {
	b.Helper()
	reg := datastore.NewRegistry()
	sched, err := scheduling.New(nil, scheduling.Options{})
	if err != nil {
		b.Fatal(err)
	}
	reg.AddObserver(sched)
	for i := 0; i < 50; i++ {
		ns, name := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("pool-%d", i)
		p := reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
			Selector: map[string]string{"app": name}, TargetPorts: []int32{8000}, PickerService: fmt.Sprintf("epp-%d", i), PickerPort: 9002})
		var src []datastore.EndpointSource
		for j := 0; j < 8; j++ {
			src = append(src, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j)},
				UID: types.UID(fmt.Sprintf("%d-%d", i, j)), IP: fmt.Sprintf("127.0.%d.%d", i+1, j+2)})
		}
		p.SetPods(src)
		p.SetSynced(true)
	}
	opts.Insecure = true
	opts.Registerer = prometheus.NewRegistry()
	srv, err := New(reg, sched, opts)
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// benchContexts are incoming stream contexts whose :authority names each
// of benchServer's pools.
func benchContexts() []context.Context {
	ctxs := make([]context.Context, 50)
	for i := range ctxs {
		ctxs[i] = metadata.NewIncomingContext(context.Background(), metadata.Pairs(":authority", fmt.Sprintf("epp-%d.ns-%d.svc:9002", i, i%10)))
	}
	return ctxs
}
