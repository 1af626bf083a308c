// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling_test

import (
	"context"
	"fmt"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling"
)

func ExampleScheduler_Schedule() {
	// nil config: the one Options names (file, text), else the default.
	sched, err := scheduling.New(nil, scheduling.Options{})
	if err != nil {
		panic(err)
	}
	reg := datastore.NewRegistry()
	reg.AddObserver(sched) // so state of departed endpoints and pools is dropped
	pool := reg.Upsert(datastore.PoolKey{Namespace: "ns", Name: "llama"}, &datastore.PoolSpec{TargetPorts: []int32{8000}})
	pool.SetPods([]datastore.EndpointSource{{UID: "a", IP: "10.0.0.1"}, {UID: "b", IP: "10.0.0.2"}})
	busy := map[string]int{"10.0.0.1:8000": 9, "10.0.0.2:8000": 0}
	for _, e := range pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{WaitingRequests: busy[e.Address], ScrapedAt: time.Now()})
	}

	res, err := sched.Schedule(context.Background(), pool, &scheduling.Request{Model: "llama", Prompt: []byte("You are a helpful assistant.")})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Endpoints[0].Address, "then", res.Endpoints[1].Address, "profile", res.Profile)

	// Saturate the pool: the request's life (package requestcontrol) asks
	// this before it schedules a sheddable request, and refuses it with 429.
	for _, e := range pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{WaitingRequests: 50, ScrapedAt: time.Now()})
	}
	saturated, why := sched.AdmissionSaturated(pool)
	fmt.Println(saturated, why)
	// Output:
	// 10.0.0.2:8000 then 10.0.0.1:8000 profile default
	// true its endpoints' mean load, of 5 waiting requests or 80% KV cache each, is 10.00
}
