// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
	"github.com/poolpicker/poolpicker/scheduling/internal/dsview"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

func TestPartitionKnown(t *testing.T) {
	tp := newTestPool(t, 6, nil)
	m := &datastore.Metrics{}
	c := schedtest.Candidates(tp.Pool)
	known := []bool{false, true, false, false, true, true}
	for i := range c {
		c[i].Metrics = framework.Metrics{}
		if known[i] {
			c[i].Metrics = dsview.Metrics(m)
		}
	}
	orig := append([]framework.Candidate{}, c...)
	if k := partitionKnown(c); k != 3 {
		t.Fatalf("%d known, want 3", k)
	}
	want := []int{1, 4, 5, 0, 2, 3}
	for i, j := range want {
		if c[i].Endpoint != orig[j].Endpoint {
			t.Fatalf("position %d holds %s, want %s (stable order)", i, c[i].Endpoint.Address(), orig[j].Endpoint.Address())
		}
	}
}
