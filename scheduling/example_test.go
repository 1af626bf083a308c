// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling_test

import (
	"context"
	"errors"
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
	pool.SetPolicy(&datastore.Policy{Objectives: map[string]int{"batch": -1}})

	res, err := sched.Schedule(context.Background(), pool, &scheduling.Request{Model: "llama", Prompt: []byte("You are a helpful assistant.")})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Endpoints[0].Address, "then", res.Endpoints[1].Address, "profile", res.Profile)

	// Saturate the pool: sheddable requests are refused with 429.
	for _, e := range pool.Endpoints().Endpoints {
		e.SetMetrics(&datastore.Metrics{WaitingRequests: 50, ScrapedAt: time.Now()})
	}
	_, err = sched.Schedule(context.Background(), pool, &scheduling.Request{Objective: "batch"})
	var se *scheduling.Error
	if errors.As(err, &se) {
		fmt.Println(se.Code, se.Reason)
	}
	// Output:
	// 10.0.0.2:8000 then 10.0.0.1:8000 profile default
	// 429 Shed
}
