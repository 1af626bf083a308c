// Command scrape measures the process CPU poolpicker spends keeping many
// endpoints' metrics fresh: it scrapes N model servers (a child process
// serving real-size vLLM pages on loopback IPs 127.0.0.2, 127.0.0.3, ...,
// all on one port) at the refresh interval for a while, with the fast-path
// parser and then, as the baseline, with expfmt parsing whole pages.
//
//	go run ./bench/scrape -endpoints 100 -interval 50ms -duration 60s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
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
	modes := flag.String("modes", "fast,expfmt", "parsers to measure, in order: fast, expfmt")
	serve := flag.Bool("serve", false, "run as the model-server child")
	flag.Parse()
	if *serve {
		if err := serveModelServers(*endpoints, *pageBytes); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*endpoints, *interval, *duration, *warmup, *pageBytes, strings.Split(*modes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(endpoints int, interval, duration, warmup time.Duration, pageBytes int, modes []string) error {
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
	fmt.Printf("%d endpoints, interval %v, %v per mode, pages of at least %d bytes, GOMAXPROCS=%s\n",
		endpoints, interval, duration, pageBytes, os.Getenv("GOMAXPROCS"))
	var baseline float64
	for _, mode := range modes {
		cores, err := measure(mode, endpoints, port, interval, duration, warmup)
		if err != nil {
			return err
		}
		if baseline == 0 {
			baseline = cores
		} else {
			fmt.Printf("  ratio %s / %s = %.3f\n", mode, modes[0], cores/baseline)
		}
	}
	return nil
}

func measure(mode string, endpoints, port int, interval, duration, warmup time.Duration) (float64, error) {
	opts := scrape.Options{RefreshInterval: interval}
	switch mode {
	case "fast":
	case "expfmt":
		opts.DisableFastPath = true
	default:
		return 0, fmt.Errorf("unknown mode %q", mode)
	}
	m, err := scrape.NewManager(opts)
	if err != nil {
		return 0, err
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(m)
	pool := reg.Upsert(types.NamespacedName{Namespace: "bench", Name: "pool"}, &datastore.PoolSpec{TargetPorts: []int32{int32(port)}})
	var pods []datastore.EndpointSource
	for i := 0; i < endpoints; i++ {
		ip := loopbackIP(i)
		pods = append(pods, datastore.EndpointSource{Pod: types.NamespacedName{Namespace: "bench", Name: ip}, UID: types.UID(ip), IP: ip})
	}
	pool.SetPods(pods)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	time.Sleep(warmup) // a harness's fixed measuring window, not a wait for an event
	before, t0, s0 := cpu(), time.Now(), m.Stats()
	time.Sleep(duration)
	after, t1, s1 := cpu(), time.Now(), m.Stats()
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	wall := t1.Sub(t0)
	used := after - before
	cores := used.Seconds() / wall.Seconds()
	scrapes := s1.Scrapes - s0.Scrapes
	fresh := 0
	for _, e := range pool.Endpoints().Endpoints {
		if e.Metrics().Fresh(t1, scrape.DefaultStalenessThreshold) {
			fresh++
		}
	}
	fmt.Printf("%-7s CPU %.3f cores (%v in %v); %d scrapes (%.0f/s), %d errors; %.1f µs CPU per scrape; %d/%d endpoints fresh at the end\n",
		mode, cores, used.Round(time.Millisecond), wall.Round(time.Millisecond), scrapes, float64(scrapes)/wall.Seconds(),
		s1.Errors-s0.Errors, float64(used.Microseconds())/float64(max(scrapes, 1)), fresh, endpoints)
	return cores, nil
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
