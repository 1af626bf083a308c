// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scheduling"
	"github.com/poolpicker/poolpicker/scrape"
)

// modelServerEnv makes the test binary a model server (firstPickModelServer)
// instead of running tests.
const modelServerEnv = "EXTPROC_BENCH_MODEL_SERVER"

// firstPickModelServer serves a real-size vLLM page on one port of every
// loopback address, at the lowest CPU priority (in a cluster the model
// servers are other machines), prints the port and serves until its stdin
// closes.
func firstPickModelServer() error {
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19); err != nil {
		return err
	}
	page, err := vllmpage.Page(vllmpage.State{Waiting: 1, Running: 2, KVCacheUsage: 0.3, MaxLoRA: 4, BlockSize: 16, NumGPUBlocks: 8192}, vllmpage.Options{})
	if err != nil {
		return err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, "lo")
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", "0.0.0.0:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(page)))
		w.Write(page) //nolint:errcheck
	})}
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// startFirstPickModelServer runs firstPickModelServer in a process of its
// own and returns its port.
func startFirstPickModelServer(b *testing.B) int32 {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), modelServerEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("model server: %v", err)
	}
	port, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		b.Fatalf("model server port %q: %v", line, err)
	}
	return int32(port)
}

// firstPickFixture is a picker with many idle pools of five endpoints each:
// the project's scheduler with its default profile, the ext_proc server
// over a loopback socket and, with a model server, the scraper with its
// default options, as bench/scale runs the binary at 1,000 pools. Pool i
// is ns-(i%10)/pool-i with pods on 127.(10+i/256).(i%256).(2..6).
type firstPickFixture struct {
	reg     *datastore.Registry
	pools   int
	port    int32
	scraper *scrape.Manager
	client  *eppclient.Client
	req     eppclient.Request
}

func newFirstPickFixture(b *testing.B, pools int, scraping bool) *firstPickFixture {
	b.Helper()
	reg := datastore.NewRegistry()
	prom := prometheus.NewRegistry()
	f := &firstPickFixture{reg: reg, port: 8000}
	if scraping {
		f.port = startFirstPickModelServer(b)
		m, err := scrape.NewManager(scrape.Options{Registerer: prom})
		if err != nil {
			b.Fatal(err)
		}
		reg.AddObserver(m)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Start(ctx) }()
		b.Cleanup(func() {
			cancel()
			<-done
		})
		f.scraper = m
	}
	sched, err := scheduling.New(nil, scheduling.Options{Registerer: prom})
	if err != nil {
		b.Fatal(err)
	}
	reg.AddObserver(sched)
	f.grow(pools)
	ts := startServer(b, reg, sched, Options{Insecure: true, Registerer: prom, PoolsSynced: func() bool { return true }})
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Summarise the scale benchmark in one sentence.","max_tokens":16}`)
	f.client = ts.client
	f.req = eppclient.Request{Shape: eppclient.FullDuplex, Body: body, Headers: []eppclient.Header{
		{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
		{Key: ":authority", Value: "gw.example"}, {Key: "content-type", Value: "application/json"},
		{Key: "content-length", Value: strconv.Itoa(len(body))}}}
	// The connection and the server's first stream: no pool's cost.
	f.pick(b, 0)
	if f.scraper != nil {
		// Every server scraped once at its start, then idle.
		for f.scraper.Stats().Scrapes < uint64(5*pools) {
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
	}
	return f
}

// grow adds pools up to n.
func (f *firstPickFixture) grow(n int) {
	for i := f.pools; i < n; i++ {
		ns, name := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("pool-%d", i)
		p := f.reg.Upsert(types.NamespacedName{Namespace: ns, Name: name}, &datastore.PoolSpec{
			Selector: map[string]string{"app": name}, TargetPorts: []int32{f.port}, PickerService: "epp", PickerPort: 9002,
		})
		var srcs []datastore.EndpointSource
		for j := range 5 {
			srcs = append(srcs, datastore.EndpointSource{
				Pod: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j)},
				UID: types.UID(fmt.Sprintf("uid-%d-%d", i, j)),
				IP:  fmt.Sprintf("127.%d.%d.%d", 10+i/256, i%256, j+2),
			})
		}
		p.SetPods(srcs)
		p.SetSynced(true)
	}
	f.pools = max(f.pools, n)
}

// pick sends one request for pool i and returns the time until its
// destination came back.
func (f *firstPickFixture) pick(b *testing.B, i int) time.Duration {
	req := f.req
	req.PoolTag = fmt.Sprintf("ns-%d/pool-%d", i%10, i)
	res, err := f.client.Do(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	if res.Destination == "" {
		b.Fatalf("pool %d: no destination (%+v)", i, res)
	}
	return res.Decided
}

// BenchmarkFirstPick measures an idle pool's first pick against its second,
// as bench/scale's cold phase sends them: one pool at a time, 20 ms apart,
// the second right after the first, over 1,000 pools idle since they were
// scraped at their start. An op is one pool's two picks; reported are the
// p50 and p90 of each pick's time until the destination came back, and
// the ratio of the p50s. scraper=on runs the scraper against a model
// server process at low priority, so that the first pick has its pool's
// servers scraped.
func BenchmarkFirstPick(b *testing.B) {
	for _, c := range []struct {
		scraping, warm bool
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		scraping := c.scraping
		name := fmt.Sprintf("scraper=%v/pool=%v", map[bool]string{false: "off", true: "on"}[scraping], map[bool]string{false: "cold", true: "warm"}[c.warm])
		b.Run(name, func(b *testing.B) {
			const pools = 1000
			f := newFirstPickFixture(b, pools, scraping)
			var first, second []float64
			i := 0
			for b.Loop() {
				i++
				if i >= f.pools {
					b.StopTimer()
					f.grow(f.pools + pools)
					b.StartTimer()
				}
				p := i
				if c.warm {
					p = 1
				}
				time.Sleep(20 * time.Millisecond)
				first = append(first, float64(f.pick(b, p).Microseconds()))
				second = append(second, float64(f.pick(b, p).Microseconds()))
			}
			slices.Sort(first)
			slices.Sort(second)
			q := func(s []float64, p int) float64 { return s[(len(s)-1)*p/100] }
			b.ReportMetric(q(first, 50), "first-p50-µs")
			b.ReportMetric(q(first, 90), "first-p90-µs")
			b.ReportMetric(q(second, 50), "second-p50-µs")
			b.ReportMetric(q(second, 90), "second-p90-µs")
			b.ReportMetric(q(first, 50)/q(second, 50), "first/second-p50")
		})
	}
}
