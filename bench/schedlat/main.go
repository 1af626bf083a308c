// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command schedlat reads a Go execution trace (bench/scale -traces) and
// reports how long goroutines waited to run once runnable, by the function
// they had blocked in, and how long every P was busy at once: the time when
// work that becomes ready, a request's included, finds no free core.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	match := flag.String("match", "poolpicker", "Group waits by the innermost frame whose function contains this (others are not reported).")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: schedlat [-match S] TRACE\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	r, err := analyze(f, *match)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	r.print(os.Stdout)
}

// report is what one trace shows.
type report struct {
	// waits are the runnable-to-running delays, by the function the
	// goroutine had blocked in.
	waits map[string][]time.Duration
	// span is the trace's length; procs the most Ps seen running at once.
	span  time.Duration
	procs int
	// allBusy are the stretches during which procs Ps ran at once.
	allBusy []time.Duration
	// gcMarks counts the GC mark phases that began in the trace.
	gcMarks int
}

// stretch is a time during which n Ps ran.
type stretch struct {
	n int
	d time.Duration
}

// analyze reads a trace and groups goroutine waits by the innermost frame
// containing match.
func analyze(in io.Reader, match string) (*report, error) {
	tr, err := trace.NewReader(in)
	if err != nil {
		return nil, err
	}
	rep := &report{waits: map[string][]time.Duration{}}
	var (
		first, last trace.Time
		blockedIn   = map[trace.GoID]string{}
		readyAt     = map[trace.GoID]trace.Time{}
		running     = map[trace.ProcID]bool{}
		busy        int
		busySince   trace.Time
		stretches   []stretch
	)
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		switch ev.Kind() {
		case trace.EventRangeBegin:
			if ev.Range().Name == "GC concurrent mark phase" {
				rep.gcMarks++
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			switch st.Resource.Kind {
			case trace.ResourceProc:
				_, to := st.Proc()
				id, now := st.Resource.Proc(), to == trace.ProcRunning
				if running[id] == now {
					continue
				}
				running[id] = now
				// A stretch at n Ps ends whenever the count changes.
				if busy > 0 {
					stretches = append(stretches, stretch{busy, time.Duration(ev.Time() - busySince)})
				}
				if now {
					busy++
				} else {
					busy--
				}
				busySince = ev.Time()
				rep.procs = max(rep.procs, busy)
			case trace.ResourceGoroutine:
				id := st.Resource.Goroutine()
				from, to := st.Goroutine()
				switch {
				case to == trace.GoWaiting:
					blockedIn[id] = innermost(st.Stack, match)
				case to == trace.GoRunnable:
					readyAt[id] = ev.Time()
				case from == trace.GoRunnable && to == trace.GoRunning:
					if t, ok := readyAt[id]; ok && blockedIn[id] != "" {
						rep.waits[blockedIn[id]] = append(rep.waits[blockedIn[id]], time.Duration(ev.Time()-t))
					}
					delete(readyAt, id)
					delete(blockedIn, id)
				}
			}
		}
	}
	rep.span = time.Duration(last - first)
	// Only stretches at the most Ps count: fewer means a core was free. A
	// P handed from one thread to another shows as a dip of no length,
	// which does not end a stretch.
	var run time.Duration
	for _, s := range stretches {
		switch {
		case s.n == rep.procs:
			run += s.d
		case s.d > 0 && run > 0:
			rep.allBusy = append(rep.allBusy, run)
			run = 0
		}
	}
	if run > 0 {
		rep.allBusy = append(rep.allBusy, run)
	}
	return rep, nil
}

// innermost is the innermost frame of stk whose function contains match.
func innermost(stk trace.Stack, match string) string {
	for fr := range stk.Frames() {
		if strings.Contains(fr.Func, match) {
			return fr.Func
		}
	}
	return ""
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "trace of %v, %d Ps, %d GC mark phases begun\n", r.span.Round(time.Millisecond), r.procs, r.gcMarks)
	var total, over5 time.Duration
	for _, d := range r.allBusy {
		total += d
		if d > 5*time.Millisecond {
			over5 += d
		}
	}
	longest := slices.Sorted(slices.Values(r.allBusy))
	slices.Reverse(longest)
	longest = longest[:min(5, len(longest))]
	fmt.Fprintf(w, "all %d Ps busy: %v (%.0f %% of the trace), %v of it in stretches longer than 5 ms; longest %v\n",
		r.procs, total.Round(time.Millisecond), 100*total.Seconds()/max(r.span.Seconds(), 1e-9), over5.Round(time.Millisecond), longest)
	fmt.Fprintln(w, "waited to run once runnable, by where the goroutine had blocked:")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.waits {
			if !yield(k) {
				return
			}
		}
	}) {
		d := slices.Sorted(slices.Values(r.waits[k]))
		fmt.Fprintf(w, "  %-80s n=%d p50=%v p99=%v max=%v\n", k, len(d), d[len(d)/2], d[len(d)*99/100], d[len(d)-1])
	}
}
