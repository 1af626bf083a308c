// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/poolpicker/poolpicker/bench/internal/proc"
	"github.com/poolpicker/poolpicker/internal/vllmpage"
)

// Model servers: each process listens on the wildcard address of the
// loopback device only (SO_BINDTODEVICE "lo"), on the pools' port, with
// SO_REUSEPORT so that a few processes share the connections. Every pod
// address 127.100.b.c therefore has its own server address, one scrape per
// address as in a cluster, without 50,000 listening sockets; a process
// tells the pods apart by the address a connection came to.

const roleEnv = "SCALE_MODEL_SERVER_PORT"

// servedLog records when each pod address was served a page, so that the
// parent can tell how old the values a pick saw were.
type servedLog struct {
	mu    [256]sync.Mutex
	times [maxAddresses][]int64
}

func (l *servedLog) add(i int, t int64) {
	m := &l.mu[i%len(l.mu)]
	m.Lock()
	l.times[i] = append(l.times[i], t)
	m.Unlock()
}

// latest is the last time address i was served at or before t, 0 if never.
func (l *servedLog) latest(i int, t int64) int64 {
	m := &l.mu[i%len(l.mu)]
	m.Lock()
	defer m.Unlock()
	ts := l.times[i]
	for k := len(ts) - 1; k >= 0; k-- {
		if ts[k] <= t {
			return ts[k]
		}
	}
	return 0
}

// ageQuery asks for the last page served to Addr at or before At (Unix ns).
type ageQuery struct {
	Addr int   `json:"addr"`
	At   int64 `json:"at"`
}

// serveModelServers is a model-server process's main (roleEnv holds the port).
func serveModelServers(port string) error {
	const variants = 16
	pages := make([][]byte, variants)
	for j := range pages {
		p, err := vllmpage.Page(vllmpage.State{
			Waiting: j % 4, Running: j, KVCacheUsage: float64(j) / variants, MaxLoRA: 4,
			RunningAdapters: []string{"sql-lora"}, BlockSize: 16, NumGPUBlocks: 8192, ServedRequests: 1000 + 10*j,
		}, vllmpage.Options{Seed: uint64(j)})
		if err != nil {
			return err
		}
		pages[j] = p
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, "lo")
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", net.JoinHostPort("0.0.0.0", port))
	if err != nil {
		return fmt.Errorf("listening on port %s of the loopback device: %w", port, err)
	}
	var log servedLog
	var served atomic.Int64
	// hang is the range of pod addresses [from, to) that answer no scrape:
	// their requests are held until the scraper gives up.
	var hang atomic.Pointer[[2]int]
	hang.Store(&[2]int{})
	responses := make([][]byte, len(pages))
	for j, p := range pages {
		responses[j] = append(fmt.Appendf(nil, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: %d\r\n\r\n", len(p)), p...)
	}
	pp := &pageServer{responses: responses, log: &log, served: &served, hang: &hang}
	go pp.serve(ln)

	ctl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /served", func(w http.ResponseWriter, r *http.Request) {
		var qs []ageQuery
		if err := json.NewDecoder(r.Body).Decode(&qs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := make([]int64, len(qs))
		for k, q := range qs {
			if q.Addr >= 0 && q.Addr < maxAddresses {
				out[k] = log.latest(q.Addr, q.At)
			}
		}
		json.NewEncoder(w).Encode(out) //nolint:errcheck
	})
	mux.HandleFunc("POST /hang", func(w http.ResponseWriter, r *http.Request) {
		var h [2]int
		if err := json.NewDecoder(r.Body).Decode(&h); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		hang.Store(&h)
	})
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, served.Load()) })
	go http.Serve(ctl, mux) //nolint:errcheck
	fmt.Printf("READY %s\n", ctl.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return nil
}

// pageServer answers GET /metrics on every pod address with one of a few
// pre-rendered responses, on kept connections. It stands in for model
// servers on other machines, so it costs this machine as little as it can:
// a read and a write per page, where net/http's server spent about as much
// CPU again as poolpicker's scrape of the page.
type pageServer struct {
	responses [][]byte
	log       *servedLog
	served    *atomic.Int64
	hang      *atomic.Pointer[[2]int]
}

var notFound = []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

func (ps *pageServer) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go ps.conn(c)
	}
}

// conn serves one connection's requests, one at a time, until the client
// closes it or sends what is not a GET.
func (ps *pageServer) conn(c net.Conn) {
	defer c.Close()
	tcp, _ := c.LocalAddr().(*net.TCPAddr)
	i, ok := 0, false
	if tcp != nil {
		i, ok = podIndex(tcp.IP)
	}
	buf := make([]byte, 0, 4096)
	for {
		end := bytes.Index(buf, []byte("\r\n\r\n"))
		if end < 0 {
			if len(buf) == cap(buf) {
				return // a header this long is no scrape
			}
			n, err := c.Read(buf[len(buf):cap(buf)])
			if err != nil {
				return
			}
			buf = buf[:len(buf)+n]
			continue
		}
		path, isGet := bytes.CutPrefix(buf[:end], []byte("GET "))
		path, _, _ = bytes.Cut(path, []byte(" "))
		buf = buf[:copy(buf, buf[end+4:])]
		if !isGet {
			return
		}
		if !ok || string(path) != "/metrics" {
			if _, err := c.Write(notFound); err != nil {
				return
			}
			continue
		}
		if h := ps.hang.Load(); i >= h[0] && i < h[1] {
			// Held until the scraper gives up and closes.
			_, _ = io.Copy(io.Discard, c)
			return
		}
		n := ps.served.Add(1)
		ps.log.add(i, time.Now().UnixNano())
		if _, err := c.Write(ps.responses[(i+int(n))%len(ps.responses)]); err != nil {
			return
		}
	}
}

// modelServers are the running model-server processes.
type modelServers struct {
	cmds []*exec.Cmd
	ctl  []string
}

// startModelServers starts n model-server processes at nice value nice.
func startModelServers(ctx context.Context, n, port, nice int) (*modelServers, error) {
	ms := &modelServers{}
	for range n {
		cmd, out, err := startRole(ctx, roleEnv+"="+strconv.Itoa(port))
		if err != nil {
			ms.stop()
			return nil, err
		}
		ms.cmds = append(ms.cmds, cmd)
		line, err := out.ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "READY ")
		if err != nil || !ok {
			ms.stop()
			return nil, errors.Join(fmt.Errorf("model server did not start (%q)", line), err)
		}
		ms.ctl = append(ms.ctl, addr)
		if nice != 0 {
			if err := proc.Renice(cmd.Process.Pid, nice); err != nil {
				ms.stop()
				return nil, err
			}
		}
	}
	return ms, nil
}

func (ms *modelServers) stop() {
	for _, c := range ms.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
		_ = c.Wait()
	}
}

// cpu is the model-server processes' CPU so far, in seconds.
func (ms *modelServers) cpu() float64 {
	s := 0.0
	for _, c := range ms.cmds {
		s += proc.CPU(c.Process.Pid)
	}
	return s
}

// served is how many pages the servers have served.
func (ms *modelServers) served() (int64, error) {
	var n int64
	for _, a := range ms.ctl {
		resp, err := http.Get("http://" + a + "/count")
		if err != nil {
			return 0, err
		}
		var k int64
		_, err = fmt.Fscan(resp.Body, &k)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// hang has the pod addresses [from, to) hold every scrape until the
// scraper gives up (from == to: none).
func (ms *modelServers) hang(from, to int) error {
	body, err := json.Marshal([2]int{from, to})
	if err != nil {
		return err
	}
	for _, a := range ms.ctl {
		resp, err := http.Post("http://"+a+"/hang", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("model server %s: hang: %s", a, resp.Status)
		}
	}
	return nil
}

// lastServed returns, for each query, the last time its address was served
// a page at or before its time (by any of the processes), 0 if never.
func (ms *modelServers) lastServed(qs []ageQuery) ([]int64, error) {
	body, err := json.Marshal(qs)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(qs))
	for _, a := range ms.ctl {
		resp, err := http.Post("http://"+a+"/served", "application/json", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		var ts []int64
		err = json.NewDecoder(resp.Body).Decode(&ts)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if len(ts) != len(qs) {
			return nil, fmt.Errorf("model server %s answered %d times for %d queries", a, len(ts), len(qs))
		}
		for k, t := range ts {
			out[k] = max(out[k], t)
		}
	}
	return out, nil
}
