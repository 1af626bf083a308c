// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package main

import (
	"bytes"
	"context"
	"testing"
)

// TestReferenceEPP runs a short point through the reference EPP's binary
// (router reference-epp: its own process against a real API server) and
// poolpicker side by side: every request is served through each, and the
// reference, routing by its own prefix cache, hits the servers' caches on
// a workload of few prefixes as poolpicker does. Skipped when the binary
// (`make reference-epp`) or the control plane is missing.
func TestReferenceEPP(t *testing.T) {
	referenceBinary = defaultReferenceBinary()
	if why := referenceMissing(); why != "" {
		t.Skipf("reference-epp: %s", why)
	}
	t.Cleanup(stopControlPlane)
	c := defaultSweep()
	c.requests, c.timeScale = 80, 0.5
	c.routers = []router{allRouters[0], referenceRouter}
	c.replicas = []int{1}
	rs, err := runPoint(context.Background(), &c, 2, 0.3, false)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printResults(&out, rs, true)
	t.Logf("G=2 load=30%%:\n%s", out.String())
	for _, r := range rs {
		if r.failed > 0 || r.served == 0 {
			t.Fatalf("%s: %d failed, %d served: %s", r.series(), r.failed, r.served, r.firstFailure)
		}
		// Two prefixes on four servers: any router that follows its
		// prefixes hits on most of each prompt once warm.
		if r.hitRate < 0.6 {
			t.Errorf("%s: hit rate %.3f, want at least 0.6", r.series(), r.hitRate)
		}
	}
}
