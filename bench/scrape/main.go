// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command scrape measures what poolpicker spends keeping many endpoints'
// metrics fresh: it scrapes N model servers (a child process serving
// real-size vLLM pages on loopback IPs 127.0.0.2, 127.0.0.3, ..., all on one
// port), each held by -pools-per-server pools, at the refresh interval for a
// while, in each mode in turn: CPU, goroutines, allocations and requests.
//
// Modes: "scheduler" is the shared scrape scheduler with every pool busy;
// "idle" the same with no pool getting requests, so that the servers decay
// to -idle-interval; "expfmt" is the scheduler parsing whole pages with
// expfmt instead of the fast path; "nobudget" is the scheduler without its
// CPU budget (its scrapes still timed); "read" is the
// physical cost, the floor of the others: each server's page read over a
// kept connection at the refresh interval, with the least a client can do
// (write the GET, read the header and Content-Length bytes), nothing parsed
// or published.
//
//	go -C bench run ./scrape -endpoints 1000 -pools-per-server 2 -interval 50ms -duration 20s -modes read,scheduler,read,scheduler
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scrape"
)

func main() {
	endpoints := flag.Int("endpoints", 100, "model servers to scrape")
	interval := flag.Duration("interval", scrape.DefaultRefreshInterval, "refresh interval")
	duration := flag.Duration("duration", 60*time.Second, "measured time per mode")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured time before each mode")
	pageBytes := flag.Int("page-bytes", vllmpage.DefaultMinBytes, "smallest metrics page served")
	modes := flag.String("modes", "read,scheduler", "modes to measure, in order (the first is the baseline of the ratios): read, scheduler, nobudget, expfmt, idle")
	poolsPerServer := flag.Int("pools-per-server", 1, "pools holding each model server")
	idleInterval := flag.Duration("idle-interval", scrape.DefaultIdleRefreshInterval, "longest interval of an idle pool's servers (the idle mode)")
	serve := flag.Bool("serve", false, "run as the model-server child")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "Write a CPU profile of each mode's measured window to this path prefix (PREFIX.MODE.N.pprof).")
	flag.Parse()
	if *serve {
		if err := serveModelServers(*endpoints, *pageBytes); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*endpoints, *poolsPerServer, *interval, *idleInterval, *duration, *warmup, *pageBytes, strings.Split(*modes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// cpuProfile is the -cpuprofile path prefix; profiled counts the
// profiles written.
var (
	cpuProfile string
	profiled   int
)

// startProfile starts the CPU profile of one mode's window; the returned
// function stops it.
func startProfile(mode string) (func(), error) {
	if cpuProfile == "" {
		return func() {}, nil
	}
	profiled++
	f, err := os.Create(fmt.Sprintf("%s.%s.%d.pprof", cpuProfile, mode, profiled))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func run(endpoints, poolsPerServer int, interval, idleInterval, duration, warmup time.Duration, pageBytes int, modes []string) error {
	// The servers run in a child process so that this process's CPU is the
	// scraper's alone.
	child := exec.Command(os.Args[0], "-serve", "-endpoints", strconv.Itoa(endpoints), "-page-bytes", strconv.Itoa(pageBytes))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	defer func() {
		child.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		child.Wait()                          //nolint:errcheck
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("model-server child: %w", err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "READY ")))
	if err != nil {
		return fmt.Errorf("model-server child said %q", line)
	}
	fmt.Printf("%d servers in %d pools each (%d pool endpoints), interval %v, %v per mode, pages of at least %d bytes, GOMAXPROCS=%d\n",
		endpoints, poolsPerServer, endpoints*poolsPerServer, interval, duration, pageBytes, runtime.GOMAXPROCS(0))
	var base *result
	for _, mode := range modes {
		r, err := measure(mode, endpoints, poolsPerServer, port, interval, idleInterval, duration, warmup)
		if err != nil {
			return err
		}
		r.print()
		if base == nil {
			base = &r
		} else if r.mode != base.mode {
			fmt.Printf("  %s / %s: CPU %.3f, goroutines %.3f, allocations %.3f, requests %.3f\n", r.mode, base.mode,
				r.cores/base.cores, float64(r.goroutines)/float64(base.goroutines), r.allocsPerSec/base.allocsPerSec, r.scrapesPerSec/base.scrapesPerSec)
		}
	}
	return nil
}

type result struct {
	mode                    string
	poolEndpoints           int
	cores                   float64
	used, wall              time.Duration
	scrapes, errors         uint64
	scrapesPerSec           float64
	allocsPerSec            float64
	goroutines              int
	fresh                   int
	cpuPerEndpointSecond    time.Duration
	cpuPerScrape            time.Duration
	allocsPerEndpointSecond float64
}

func (r result) print() {
	fmt.Printf("%-9s CPU %.3f cores (%v in %v), %v per pool-endpoint-second, %v per request; %d goroutines; %.0f allocations/s (%.1f per pool-endpoint-second); %d requests (%.0f/s), %d errors; %d/%d pool endpoints fresh at the end\n",
		r.mode, r.cores, r.used.Round(time.Millisecond), r.wall.Round(time.Millisecond), r.cpuPerEndpointSecond.Round(100*time.Nanosecond),
		r.cpuPerScrape.Round(100*time.Nanosecond), r.goroutines, r.allocsPerSec, r.allocsPerEndpointSecond, r.scrapes, r.scrapesPerSec, r.errors, r.fresh, r.poolEndpoints)
}

func measure(mode string, endpoints, poolsPerServer, port int, interval, idleInterval, duration, warmup time.Duration) (result, error) {
	if mode == "read" {
		return measureRead(endpoints, port, interval, duration, warmup)
	}
	opts := scrape.Options{RefreshInterval: interval, IdleRefreshInterval: -1}
	busy := true
	switch mode {
	case "scheduler":
	case "nobudget":
		opts.CPUBudget = -1
	case "idle":
		opts.IdleRefreshInterval, busy = idleInterval, false
	case "expfmt":
		opts.DisableFastPath = true
	default:
		return result{}, fmt.Errorf("unknown mode %q", mode)
	}
	m, err := scrape.NewManager(opts)
	if err != nil {
		return result{}, err
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(m)
	var pools []*datastore.Pool
	for k := 0; k < poolsPerServer; k++ {
		pool := reg.Upsert(types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("pool-%d", k)}, &datastore.PoolSpec{TargetPorts: []int32{int32(port)}})
		var pods []datastore.EndpointSource
		for i := 0; i < endpoints; i++ {
			ip := loopbackIP(i)
			pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "bench", Name: ip}, UID: types.UID(ip), IP: ip})
		}
		pool.SetPods(pods)
		pools = append(pools, pool)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	// Busy pools get a request every 100 ms, as a gateway's would.
	noting := make(chan struct{})
	if busy {
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					close(noting)
					return
				case now := <-t.C:
					for _, p := range pools {
						p.NoteRequest(now)
					}
				}
			}
		}()
	} else {
		close(noting)
	}
	time.Sleep(warmup) // a harness's fixed measuring window, not a wait for an event
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	stopProfile, err := startProfile(mode)
	if err != nil {
		cancel()
		<-done
		return result{}, err
	}
	before, t0, s0, a0 := cpu(), time.Now(), m.Stats(), ms.Mallocs
	// Goroutines are sampled through the window: the scheduler's come and
	// go with the scrapes in flight.
	r := result{mode: mode, poolEndpoints: endpoints * poolsPerServer}
	tick := time.NewTicker(duration / 20)
	for end := t0.Add(duration); time.Now().Before(end); {
		<-tick.C
		r.goroutines = max(r.goroutines, runtime.NumGoroutine())
	}
	tick.Stop()
	runtime.ReadMemStats(&ms)
	after, t1, s1, a1 := cpu(), time.Now(), m.Stats(), ms.Mallocs
	stopProfile()
	cancel()
	<-noting
	if err := <-done; err != nil {
		return result{}, err
	}
	r.wall, r.used = t1.Sub(t0), after-before
	r.cores = r.used.Seconds() / r.wall.Seconds()
	r.scrapes, r.errors = s1.Scrapes-s0.Scrapes, s1.Errors-s0.Errors
	r.scrapesPerSec = float64(r.scrapes) / r.wall.Seconds()
	r.allocsPerSec = float64(a1-a0) / r.wall.Seconds()
	endpointSeconds := float64(r.poolEndpoints) * r.wall.Seconds()
	r.cpuPerEndpointSecond = time.Duration(float64(r.used) / endpointSeconds)
	r.cpuPerScrape = time.Duration(float64(r.used) / float64(max(r.scrapes, 1)))
	r.allocsPerEndpointSecond = float64(a1-a0) / endpointSeconds
	for _, p := range pools {
		for _, e := range p.Endpoints().Endpoints {
			if e.Metrics().Fresh(t1, scrape.DefaultStalenessThreshold) {
				r.fresh++
			}
		}
	}
	return r, nil
}

// measureRead reads every server's page once per interval over a kept
// connection each, from as many goroutines as the scheduler's slots would
// use on this machine, and nothing else.
func measureRead(endpoints, port int, interval, duration, warmup time.Duration) (result, error) {
	conns := make([]net.Conn, endpoints)
	for i := range conns {
		c, err := net.Dial("tcp", net.JoinHostPort(loopbackIP(i), strconv.Itoa(port)))
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	var requests, errs atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := make(chan int)
	workers := 4 * runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 1<<20)
			for i := range work {
				if err := readPage(conns[i], loopbackIP(i), buf); err != nil {
					errs.Add(1)
				}
				requests.Add(1)
			}
		}()
	}
	go func() {
		defer close(work)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			for i := range conns {
				select {
				case work <- i:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	time.Sleep(warmup) // a harness's fixed measuring window, not a wait for an event
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	stopProfile, err := startProfile("read")
	if err != nil {
		cancel()
		wg.Wait()
		return result{}, err
	}
	before, t0, s0, a0 := cpu(), time.Now(), requests.Load(), ms.Mallocs
	time.Sleep(duration) // the measured window
	runtime.ReadMemStats(&ms)
	after, t1, s1, a1 := cpu(), time.Now(), requests.Load(), ms.Mallocs
	stopProfile()
	r := result{mode: "read", poolEndpoints: endpoints, goroutines: runtime.NumGoroutine()}
	cancel()
	wg.Wait()
	r.wall, r.used = t1.Sub(t0), after-before
	r.cores = r.used.Seconds() / r.wall.Seconds()
	r.scrapes, r.errors = s1-s0, errs.Load()
	r.scrapesPerSec = float64(r.scrapes) / r.wall.Seconds()
	r.allocsPerSec = float64(a1-a0) / r.wall.Seconds()
	endpointSeconds := float64(r.poolEndpoints) * r.wall.Seconds()
	r.cpuPerEndpointSecond = time.Duration(float64(r.used) / endpointSeconds)
	r.cpuPerScrape = time.Duration(float64(r.used) / float64(max(r.scrapes, 1)))
	r.allocsPerEndpointSecond = float64(a1-a0) / endpointSeconds
	return r, nil
}

// readPage sends one GET on c and reads the response whole into buf.
func readPage(c net.Conn, host string, buf []byte) error {
	if _, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: " + host + "\r\n\r\n")); err != nil {
		return err
	}
	buf = buf[:0]
	want := -1
	for want < 0 || len(buf) < want {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return err
		}
		if want < 0 {
			end := bytes.Index(buf, []byte("\r\n\r\n"))
			if end < 0 {
				continue
			}
			i := bytes.Index(buf[:end], []byte("Content-Length: "))
			if i < 0 {
				return fmt.Errorf("no Content-Length")
			}
			j := i + len("Content-Length: ")
			k := bytes.IndexByte(buf[j:end+2], '\r')
			length, err := strconv.Atoi(string(buf[j : j+k]))
			if err != nil {
				return err
			}
			want = end + 4 + length
		}
	}
	return nil
}

func loopbackIP(i int) string {
	n := i + 2
	return fmt.Sprintf("127.0.%d.%d", n/256, n%256)
}

// cpu is the process's user plus system CPU time.
func cpu() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serveModelServers serves a vLLM page per endpoint, its state changing
// with every request, until SIGTERM.
func serveModelServers(endpoints, pageBytes int) error {
	var listeners []net.Listener
	port := 0
	for i := 0; i < endpoints; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(loopbackIP(i), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		port = ln.Addr().(*net.TCPAddr).Port
		listeners = append(listeners, ln)
	}
	// A few precomputed states per server: rendering pages is not what is
	// measured, and the child's CPU is not counted anyway.
	const states = 8
	pages := make([][][]byte, endpoints)
	for i := range pages {
		for j := 0; j < states; j++ {
			p, err := vllmpage.Page(vllmpage.State{
				Waiting: j, Running: i % 16, KVCacheUsage: float64(j) / states, MaxLoRA: 4,
				RunningAdapters: []string{"sql-lora"}, BlockSize: 16, NumGPUBlocks: 8192, ServedRequests: 1000 + 10*j,
			}, vllmpage.Options{MinBytes: pageBytes, Seed: uint64(i)})
			if err != nil {
				return err
			}
			pages[i] = append(pages[i], p)
		}
	}
	for i, ln := range listeners {
		var n atomic.Uint64
		ps := pages[i]
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := ps[n.Add(1)%states]
			w.Header().Set("Content-Length", strconv.Itoa(len(p)))
			w.Write(p) //nolint:errcheck
		}), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln) //nolint:errcheck
	}
	fmt.Printf("READY %d\n", port)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return nil
}
