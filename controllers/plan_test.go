// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

// TestNamespacePlanStartsFromCache starts a picker over a namespace that
// already holds more pools than the threshold: the namespace is watched
// once from the start, and no pool starts a watch of its own.
func TestNamespacePlanStartsFromCache(t *testing.T) {
	ns := env.Namespace(t, "seeded")
	const pools = 6
	for i := range pools {
		sel := map[string]string{"app": fmt.Sprintf("m%d", i)}
		createPod(t, ns, fmt.Sprintf("m%d", i), sel, ready(fmt.Sprintf("10.16.0.%d", i+1)))
		createPool(t, ns, fmt.Sprintf("pool-%d", i), sel, []int32{8000})
	}
	var log testenv.RequestLog
	r := start(t, log.Wrap(env.Config), Options{Namespaces: []string{ns}, NamespaceWatchThreshold: 4})
	r.waitFor(t, "HasSynced", r.parts.InitialSync.HasSynced)
	for i := range pools {
		r.waitEndpoints(t, datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}, fmt.Sprintf("10.16.0.%d:8000", i+1))
	}
	var selectors []string
	for _, req := range log.Requests() {
		if strings.HasSuffix(req.URL.Path, "/namespaces/"+ns+"/pods") {
			selectors = append(selectors, req.URL.Query().Get("labelSelector"))
		}
	}
	if !slices.Equal(selectors, []string{""}) {
		t.Fatalf("pod requests with selectors %q, want one request for the whole namespace", selectors)
	}
}
