// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
	"github.com/poolpicker/poolpicker/scrape/internal/fetch"
)

// hostileServer answers every metrics request on a loopback socket with
// what behave writes, for as long as behave likes: a model server whose
// tenant means harm. written counts the bytes it got onto the wire.
type hostileServer struct {
	ln      net.Listener
	ip      string
	port    int
	written atomic.Int64
}

func startHostileServer(t *testing.T, ip string, behave func(w *bufio.Writer) error) *hostileServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hs := &hostileServer{ln: ln, ip: ip, port: ln.Addr().(*net.TCPAddr).Port}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := http.ReadRequest(r); err != nil {
						return
					}
					w := bufio.NewWriterSize(countingWriter{c, &hs.written}, 32<<10)
					if behave(w) != nil || w.Flush() != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return hs
}

type countingWriter struct {
	net.Conn
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// forever writes line until the connection fails.
func forever(w *bufio.Writer, line string) error {
	for {
		if _, err := w.WriteString(line); err != nil {
			return err
		}
	}
}

// A model server that keeps its socket full (never letting a read block)
// or sends a byte now and then is cut off by the page's byte bound or the
// scrape's timeout, with a reason the error counter gets; meanwhile a
// healthy server of another pool on the same poller stays fresh, and the
// hostile scrape ends again and again, each time within its bounds.
func TestHostileServerStallsNoOtherPool(t *testing.T) {
	page := string(mustPage(t, vllmpage.State{Waiting: 3}, vllmpage.Options{}))
	chunkedHead := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(page)), 16) + "\r\n" + page + "\r\n"
	long := strings.Repeat("a", 4000)
	const maxBody = 64 << 10
	tests := []struct {
		name   string
		behave func(w *bufio.Writer) error
		reason string
	}{
		{"endless trailers", func(w *bufio.Writer) error {
			_, _ = w.WriteString(chunkedHead + "0\r\n")
			return forever(w, "X-a: "+long+"\r\n")
		}, "too_large"},
		{"endless header lines", func(w *bufio.Writer) error {
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\n")
			return forever(w, "X-a: b\r\n")
		}, "transport"},
		{"endless chunk extensions", func(w *bufio.Writer) error {
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			return forever(w, "1;"+long+"\r\na\r\n")
		}, "too_large"},
		{"endless page", func(w *bufio.Writer) error {
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
			return forever(w, "vllm:num_requests_waiting 1\n")
		}, "too_large"},
		{"a byte now and then", func(w *bufio.Writer) error {
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 60000\r\n\r\n")
			for {
				if err := w.WriteByte('#'); err != nil {
					return err
				}
				if err := w.Flush(); err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
			}
		}, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			healthy := startModelServers(t, 1)[0]
			healthy.servePage(t, vllmpage.State{Running: 2}, vllmpage.Options{})
			hostile := startHostileServer(t, "127.0.0.9", tt.behave)
			// One poller for both pools.
			opts := Options{RefreshInterval: 20 * time.Millisecond, Timeout: 300 * time.Millisecond, MaxBodyBytes: maxBody, CPUBudget: 1}
			h := newHarness(t, opts)
			b := h.addPool("b", nil, healthy.port, healthy)
			h.awaitSuccess(t, healthy.addr)
			a := h.reg.Upsert(types.NamespacedName{Namespace: "tenant-a", Name: "a"}, &datastore.PoolSpec{
				Selector: map[string]string{"app": "a"}, TargetPorts: []int32{int32(hostile.port)},
			})
			a.SetPods([]datastore.EndpointSource{{Pod: types.NamespacedName{Namespace: "tenant-a", Name: "evil"}, UID: "evil", IP: hostile.ip}})
			hostileAddr := net.JoinHostPort(hostile.ip, strconv.Itoa(hostile.port))
			bEndpoint := endpointOf(t, b, healthy.addr)
			for i := range 3 {
				ev := h.await(t, "an error from the hostile server", func(ev scrapeEvent) bool { return ev.address == hostileAddr && ev.err != nil })
				if r := fetch.ReasonOf(ev.err); r != tt.reason {
					t.Fatalf("scrape %d of the hostile server failed with %v (%s), want reason %s", i, ev.err, r, tt.reason)
				}
				if strings.Contains(ev.err.Error(), "64") && tt.reason == "too_large" && !strings.Contains(ev.err.Error(), "byte") {
					t.Errorf("scrape %d: %v does not name the bound", i, ev.err)
				}
				met := bEndpoint.Metrics()
				if met == nil || !met.Fresh(time.Now(), opts.Timeout+time.Second) {
					t.Fatalf("after hostile scrape %d the healthy pool's metrics are stale: %+v", i, met)
				}
			}
		})
	}
}

// A server whose page costs more CPU to read than its share pays for at
// its interval is scraped less often, counted on its pool; a cheap
// server of another pool keeps its interval and is not counted.
func TestCostlyPageSlowsOnlyItsPool(t *testing.T) {
	if !fetch.ThreadClock {
		t.Skip("no thread CPU clock on this platform: wall time, which a loaded machine stretches, stands for CPU")
	}
	servers := startModelServers(t, 2)
	costly, cheap := servers[0], servers[1]
	costly.serve(http.StatusOK, hostilePages[0].page(20000))
	cheap.servePage(t, vllmpage.State{Running: 2}, vllmpage.Options{MinBytes: -1})
	// The costly page takes about 150 ms of CPU to read under the race
	// detector, the cheap one about 1 ms, up to a few on a loaded machine
	// (GC assists): a share of 0.1 at 100 ms draws the line at 10 ms,
	// far from both.
	h := newHarness(t, Options{RefreshInterval: 100 * time.Millisecond, CPUBudget: -1, MaxServerCPUShare: 0.1})
	a := h.addPool("a", nil, costly.port, costly)
	h.addPool("b", nil, cheap.port, cheap)
	h.await(t, "a costly scrape counted", func(scrapeEvent) bool { return h.series(t, "poolpicker_scrape_costly_pages_total", "a")[""] >= 1 })
	counts := map[datastore.PoolKey]int{}
	h.await(t, "40 scrapes of the cheap server", func(ev scrapeEvent) bool {
		counts[ev.pool]++
		return ev.address == cheap.addr && counts[ev.pool] >= 40
	})
	if n := counts[a.Key]; n > 20 {
		t.Errorf("the costly server was scraped %d times while the cheap one was 40 times, want it slowed", n)
	}
	if got := h.series(t, "poolpicker_scrape_costly_pages_total", "b")[""]; got != 0 {
		t.Errorf("the cheap server's pool counted %v costly scrapes", got)
	}
}
