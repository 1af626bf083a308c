// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command poolwatch measures what keeping pools' endpoints fresh costs the
// picker process: it creates N pools × M pods (and optionally unrelated pods)
// on a local API server, then runs the picker's pool controller in a child
// process, and a baseline that caches every pod of the namespaces and
// filters on the client, and reports RSS, heap, sync time and API requests.
//
//	go -C bench run ./poolwatch -pools 1000 -pods 10
//	go -C bench run ./poolwatch -pools 10 -pods 10 -unrelated 20000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/poolpicker/poolpicker/bench/internal/proc"
)

type benchFlags struct {
	pools, pods, unrelated, namespaces int
	modes                              string
	qps                                float64
	burst                              int
	child                              string
	kubeconfig                         string
	nsPrefix                           string
	logV                               int
	perNamespace                       bool
	heapProfile                        string
	plainList                          bool
}

func main() {
	var f benchFlags
	flag.IntVar(&f.pools, "pools", 1000, "InferencePools to create.")
	flag.IntVar(&f.pods, "pods", 10, "Ready pods per pool.")
	flag.IntVar(&f.unrelated, "unrelated", 0, "Pods no pool selects, spread over the namespaces.")
	flag.IntVar(&f.namespaces, "namespaces", 10, "Namespaces the pools and pods are spread over.")
	flag.StringVar(&f.modes, "modes", "perpool,baseline,baseline-stripped", "Comma-separated runs: perpool (poolpicker's controllers, --pod-watch-plan=per-pool), namespace (the same with --pod-watch-plan=namespace: one watch per namespace, fanned out by selector), auto (--pod-watch-plan=auto), baseline (cache every pod of the namespaces, full objects, filter on the client), baseline-stripped (the same with poolpicker's pod transform).")
	flag.Float64Var(&f.qps, "qps", 50, "Client QPS of the measured process (poolpicker's --kube-api-qps default is 50).")
	flag.IntVar(&f.burst, "burst", 100, "Client burst of the measured process (poolpicker's --kube-api-burst default is 100).")
	flag.StringVar(&f.child, "child", "", "Internal: run one measured mode and print its result as JSON.")
	flag.StringVar(&f.kubeconfig, "child-kubeconfig", "", "Internal: the child's kubeconfig.")
	flag.BoolVar(&f.perNamespace, "per-namespace", false, "Restrict the measured process to the bench namespaces (one informer per namespace and kind) instead of watching cluster-wide; the cluster holds only the bench's pods either way.")
	flag.BoolVar(&f.plainList, "plain-list", false, "perpool: start each pod watch with a plain list and a watch instead of a streaming list (controllers.Options.DisableStreamingLists).")
	flag.StringVar(&f.heapProfile, "heap-profile", "", "Write each measured process's heap profile after sync to this path prefix (+mode).")
	flag.IntVar(&f.logV, "log-v", -1, "Log the measured process's controllers to stderr at this verbosity; -1: no logs.")
	flag.StringVar(&f.nsPrefix, "ns-prefix", "bench", "Internal: namespace name prefix.")
	flag.Parse()
	if f.pools < 0 || f.pods < 0 || f.unrelated < 0 || f.namespaces < 1 {
		fmt.Fprintln(os.Stderr, "poolwatch: -pools, -pods and -unrelated must be >= 0 and -namespaces >= 1")
		os.Exit(2)
	}
	if f.child != "" {
		if err := runChild(f); err != nil {
			fmt.Fprintln(os.Stderr, "poolwatch child:", err)
			os.Exit(1)
		}
		return
	}
	if err := runParent(f); err != nil {
		fmt.Fprintln(os.Stderr, "poolwatch:", err)
		os.Exit(1)
	}
}

func namespaces(f benchFlags) []string {
	out := make([]string, f.namespaces)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", f.nsPrefix, i)
	}
	return out
}

// result is what a child reports.
type result struct {
	Mode           string  `json:"mode"`
	SyncSeconds    float64 `json:"syncSeconds"`
	Pools          int     `json:"pools"`
	Endpoints      int     `json:"endpoints"`
	RSSBytes       int64   `json:"rssBytes"`
	PeakRSSBytes   int64   `json:"peakRSSBytes"`
	HeapInuseBytes uint64  `json:"heapInuseBytes"`
	HeapObjects    uint64  `json:"heapObjects"`
	Goroutines     int     `json:"goroutines"`
	Requests       int     `json:"requests"`
	PodRequests    int     `json:"podRequests"`
	PodWatches     int     `json:"podWatches"`
	ResponseBytes  int64   `json:"responseBytes"`
	StopSeconds    float64 `json:"stopSeconds"`
	ScopedPodReqs  bool    `json:"scopedPodRequests"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	// The API server's, measured by the parent while the child ran: RSS
	// when the child started and the most seen until it stopped, and CPU.
	APIServerRSSBefore int64   `json:"apiServerRSSBefore"`
	APIServerRSSPeak   int64   `json:"apiServerRSSPeak"`
	APIServerCPU       float64 `json:"apiServerCPU"`
}

func runParent(f benchFlags) error {
	dir, err := os.MkdirTemp("", "poolwatch")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env, err := startControlPlane()
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(env, kubeconfig); err != nil {
		return err
	}
	start := time.Now()
	if err := populate(env, f); err != nil {
		return err
	}
	fmt.Printf("created %d pools × %d pods and %d unrelated pods in %d namespaces in %s\n",
		f.pools, f.pods, f.unrelated, f.namespaces, time.Since(start).Round(time.Second))

	var results []result
	for _, mode := range strings.Split(f.modes, ",") {
		mode = strings.TrimSpace(mode)
		args := []string{"-child", mode, "-child-kubeconfig", kubeconfig,
			"-pools", fmt.Sprint(f.pools), "-pods", fmt.Sprint(f.pods), "-unrelated", fmt.Sprint(f.unrelated),
			"-namespaces", fmt.Sprint(f.namespaces), "-qps", fmt.Sprint(f.qps), "-burst", fmt.Sprint(f.burst), "-ns-prefix", f.nsPrefix, "-log-v", fmt.Sprint(f.logV), fmt.Sprintf("-per-namespace=%v", f.perNamespace), "-heap-profile", f.heapProfile, fmt.Sprintf("-plain-list=%v", f.plainList)}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Stderr = os.Stderr
		api := watchAPIServer()
		out, err := cmd.Output()
		cancel()
		apiRSS0, apiRSS, apiCPU := api()
		if err != nil {
			return fmt.Errorf("child %s: %w", mode, err)
		}
		var r result
		if err := json.Unmarshal(out, &r); err != nil {
			return fmt.Errorf("child %s printed %q: %w", mode, out, err)
		}
		r.APIServerRSSBefore, r.APIServerRSSPeak, r.APIServerCPU = apiRSS0, apiRSS, apiCPU
		results = append(results, r)
	}
	report(f, results)
	return nil
}

func report(f benchFlags, rs []result) {
	fmt.Printf("\n%d pools × %d pods, %d unrelated pods, %d namespaces, client QPS %v burst %d, plain lists %v\n", f.pools, f.pods, f.unrelated, f.namespaces, f.qps, f.burst, f.plainList)
	fmt.Printf("%-18s %9s %9s %10s %10s %10s %9s %9s %9s %11s %7s %8s %7s\n",
		"mode", "sync s", "CPU s", "RSS MiB", "peak MiB", "heap MiB", "objects", "requests", "pod reqs", "recv MiB", "gorout", "endpts", "scoped")
	for _, r := range rs {
		fmt.Printf("%-18s %9.2f %9.2f %10.1f %10.1f %10.1f %9d %9d %9d %11.1f %7d %8d %7v\n",
			r.Mode, r.SyncSeconds, r.CPUSeconds, mib(r.RSSBytes), mib(r.PeakRSSBytes), mib(int64(r.HeapInuseBytes)), r.HeapObjects,
			r.Requests, r.PodRequests, mib(r.ResponseBytes), r.Goroutines, r.Endpoints, r.ScopedPodReqs)
	}
	fmt.Println("kube-apiserver while each mode ran (from its start to its stop):")
	for _, r := range rs {
		fmt.Printf("%-18s RSS %.0f MiB at start, peak %.0f MiB (+%.0f MiB); CPU %.2f s\n", r.Mode,
			mib(r.APIServerRSSBefore), mib(r.APIServerRSSPeak), mib(r.APIServerRSSPeak-r.APIServerRSSBefore), r.APIServerCPU)
	}
	if len(rs) < 2 || rs[0].Mode != "perpool" {
		return
	}
	base := rs[0]
	for _, r := range rs[1:] {
		fmt.Printf("perpool vs %s: RSS %.2fx, heap %.2fx, sync time %.2fx, CPU %.2fx, bytes received %.2fx, requests %.2fx\n", r.Mode,
			ratio(float64(base.RSSBytes), float64(r.RSSBytes)), ratio(float64(base.HeapInuseBytes), float64(r.HeapInuseBytes)),
			ratio(base.SyncSeconds, r.SyncSeconds), ratio(base.CPUSeconds, r.CPUSeconds),
			ratio(float64(base.ResponseBytes), float64(r.ResponseBytes)), ratio(float64(base.Requests), float64(r.Requests)))
	}
}

// watchAPIServer samples this process's kube-apiserver child every 100 ms
// until the returned function is called, which returns its RSS at the
// start, the most seen, and the CPU it used meanwhile (zeros when it is not
// found).
func watchAPIServer() func() (rss0, peak int64, cpu float64) {
	pid := proc.Child(os.Getpid(), "kube-apiserver")
	if pid == 0 {
		return func() (int64, int64, float64) { return 0, 0, 0 }
	}
	rss0, cpu0 := proc.RSS(pid), proc.CPU(pid)
	peak := rss0
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				peak = max(peak, proc.RSS(pid))
			}
		}
	}()
	return func() (int64, int64, float64) {
		close(stop)
		<-done
		return rss0, peak, proc.CPU(pid) - cpu0
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
