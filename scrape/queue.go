// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import "container/heap"

// serverQueue orders the servers waiting for their next scrape by due time:
// one timer for all of them instead of one per endpoint.
type serverQueue []*server

var _ heap.Interface = (*serverQueue)(nil)

func (q serverQueue) Len() int           { return len(q) }
func (q serverQueue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }

func (q serverQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *serverQueue) Push(x any) {
	s := x.(*server)
	s.index = len(*q)
	*q = append(*q, s)
}

func (q *serverQueue) Pop() any {
	old := *q
	n := len(old)
	s := old[n-1]
	old[n-1] = nil
	s.index = -1
	*q = old[:n-1]
	return s
}
