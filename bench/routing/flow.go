// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/poolpicker/poolpicker/flowcontrol"
	"github.com/poolpicker/poolpicker/scheduling"
)

// flowRouter is poolpicker's default profile with flow control on:
// requests wait in the picker, by priority band, while the pool is
// saturated. Compared with "poolpicker" (shedding only) at the same point:
//
//	go -C bench run ./routing -routers poolpicker,poolpicker-flow-control -groups 12,24 -loads 100,120
var flowRouter = router{name: "poolpicker-flow-control", config: scheduling.DefaultConfigText, replicas: []int{1}, flowControl: true}

// The equal-priority objectives of the fairness run, offered 3:1.
const (
	objectiveFlowA = "flow-a"
	objectiveFlowB = "flow-b"
)

// flowQueueDepth is the flow-control router's saturation threshold
// (--saturation-queue-depth-threshold): the waiting requests a server may
// hold before the picker holds the rest.
var flowQueueDepth = scheduling.DefaultQueueDepthThreshold

// flowQueueTTL is the flow-control router's --flow-control-queue-ttl, in
// real time.
var flowQueueTTL = 10 * time.Minute

// flowStealBelow is the flow-control router's StealBelow: an endpoint
// with fewer requests in flight takes requests waiting for a busy one.
var flowStealBelow = flowcontrol.DefaultStealBelow

// flowPerEndpoint is the flow-control router's --flow-control-per-endpoint.
var flowPerEndpoint bool

// flowStealAfter is the flow-control router's StealAfter, in real time.
var flowStealAfter time.Duration

// bindFlowFlags adds the flow-control flags; the value returned is the
// offered load of the fairness run, 0 for none.
func bindFlowFlags(fs *flag.FlagSet) *float64 {
	fs.DurationVar(&flowQueueTTL, "flow-queue-ttl", flowQueueTTL, "the poolpicker-flow-control router's --flow-control-queue-ttl (real time): a request queued longer is answered 429")
	fs.IntVar(&flowQueueDepth, "flow-queue-depth", flowQueueDepth, "the poolpicker-flow-control router's --saturation-queue-depth-threshold: waiting requests a server holds before the picker queues the rest")
	fs.BoolVar(&flowPerEndpoint, "flow-per-endpoint", flowPerEndpoint, "the poolpicker-flow-control router's --flow-control-per-endpoint: a request is scheduled when it arrives and waits for the endpoint picked for it")
	fs.IntVar(&flowStealBelow, "flow-steal-below", flowStealBelow, "the poolpicker-flow-control router's StealBelow: an endpoint with fewer requests in flight takes a request waiting for another, busy endpoint")
	fs.DurationVar(&flowStealAfter, "flow-steal-after", flowStealAfter, "the poolpicker-flow-control router's StealAfter (real time): a request waiting this long for its busy preferred endpoint goes to any with a free slot (0: never)")
	return fs.Float64("fairness-load", 0, "run only the fairness check of flow control: two objectives of equal priority offered 3:1 at this load (share of capacity, e.g. 3 for 300 %), on the first of -groups; prints each flow's share of the requests released while both were waiting")
}

// newFlowControl is the fleet's flow controller over sched's saturation
// detector; nil when off.
func newFlowControl(on bool, sched *scheduling.Scheduler) (*flowcontrol.Controller, error) {
	if !on {
		return nil, nil
	}
	return flowcontrol.New(flowcontrol.Options{EndpointSaturated: sched.EndpointSaturated, EndpointStartsAtOnce: sched.EndpointStartsAtOnce, QueueTTL: flowQueueTTL, PerEndpoint: flowPerEndpoint, StealBelow: flowStealBelow, StealAfter: flowStealAfter})
}

// runFairness offers flow A three requests for every one of flow B, both of
// priority 0, at load on the flow-control router's fleet, and reports the
// shares of the requests the picker released while both flows had requests
// waiting for a decision: fair queuing gives 1:1 however the offer is split.
func runFairness(ctx context.Context, c *sweepConfig, load float64, stdout, stderr io.Writer) int {
	reqs := workload(c, c.groups[0], load)
	flows := make([]string, len(reqs))
	rnd := rand.New(rand.NewPCG(c.seed, 3))
	for i := range flows {
		flows[i] = objectiveFlowA
		if rnd.IntN(4) == 0 {
			flows[i] = objectiveFlowB
		}
	}
	f, err := startFleet(ctx, 0, c, flowRouter, 1)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer f.stop()
	real := func(d time.Duration) time.Duration { return time.Duration(float64(d) / c.timeScale) }
	outs := make([]outcome, len(reqs))
	errs := make([]error, len(reqs))
	arrived := make([]time.Time, len(reqs))
	start := time.Now()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range reqs {
		if d := time.Until(start.Add(real(reqs[i].at))); d > 0 {
			timer.Reset(d)
			<-timer.C
		}
		arrived[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = f.send(ctx, arrived[i], fmt.Sprintf("req-%d", i), flows[i], reqs[i].body)
		}()
	}
	wg.Wait()
	offered := map[string]int{}
	for i := range reqs {
		offered[flows[i]]++
		if errs[i] != nil {
			fmt.Fprintf(stderr, "request %d: %v\n", i, errs[i])
			return 1
		}
	}
	served := bothBackloggedShares(arrived, outs, flows)
	a, b := served[objectiveFlowA], served[objectiveFlowB]
	fmt.Fprintf(stdout, "fairness at %.0f %% load, G=%d: offered %s %d : %s %d; released while both waited: %s %d, %s %d (ratio %.2f)\n",
		load*100, c.groups[0], objectiveFlowA, offered[objectiveFlowA], objectiveFlowB, offered[objectiveFlowB], objectiveFlowA, a, objectiveFlowB, b, float64(a)/float64(max(b, 1)))
	return 0
}

// bothBackloggedShares counts, per flow, the requests whose decision came
// while each flow had at least one other request waiting for its own.
func bothBackloggedShares(arrived []time.Time, outs []outcome, flows []string) map[string]int {
	type event struct {
		at     time.Time
		i      int
		decide bool
	}
	var evs []event
	for i := range outs {
		evs = append(evs, event{arrived[i], i, false}, event{outs[i].decided, i, true})
	}
	slices.SortFunc(evs, func(x, y event) int { return x.at.Compare(y.at) })
	waiting := map[string]int{}
	served := map[string]int{}
	for _, e := range evs {
		fl := flows[e.i]
		if !e.decide {
			waiting[fl]++
			continue
		}
		waiting[fl]--
		if waiting[objectiveFlowA] > 0 && waiting[objectiveFlowB] > 0 {
			served[fl]++
		}
	}
	return served
}

// waitSplit says where the served requests waited, critical and sheddable
// apart: p50 and p90 of the wait for the picker's answer (flow control's
// queue; scheduling alone without it) and of the rest of TTFT (the
// server's queue and prefill), in simulated seconds.
func waitSplit(reqs []request, outs []outcome, errs []error, start time.Time, real, sim func(time.Duration) time.Duration) string {
	var picker, server [2][]time.Duration // by sheddable
	for i, r := range reqs {
		if errs[i] != nil || outs[i].status != 200 {
			continue
		}
		k := 0
		if r.sheddable {
			k = 1
		}
		w := outs[i].decided.Sub(start.Add(real(r.at)))
		picker[k] = append(picker[k], sim(w))
		server[k] = append(server[k], sim(outs[i].ttft-w))
	}
	var b strings.Builder
	for k, name := range []string{"critical", "sheddable"} {
		if len(picker[k]) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s wait p50/p90 in the picker %s/%s s, then to the first token %s/%s s", name,
			secs(quantile(picker[k], 0.5)), secs(quantile(picker[k], 0.9)), secs(quantile(server[k], 0.5)), secs(quantile(server[k], 0.9)))
	}
	return b.String()
}
