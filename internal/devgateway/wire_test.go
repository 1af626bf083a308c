// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"testing"

	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/eppclient"
)

// TestWireNamesEqualTheServer: the development gateway implements the
// gateway's side of the protocol without the picker's code, so that tests
// through it check the picker against the protocol rather than against
// itself; its wire names, and the test client's, must still be the
// picker's.
func TestWireNamesEqualTheServer(t *testing.T) {
	for _, c := range []struct{ what, gateway, server, client string }{
		{"destination header and envoy.lb key", HeaderDestination, extproc.HeaderDestination, eppclient.HeaderDestination},
		{"dynamic metadata namespace", MetadataNamespaceLB, extproc.MetadataNamespaceLB, eppclient.MetadataNamespaceLB},
		{"served endpoint metadata key", MetadataKeyServed, extproc.HeaderDestinationServed, eppclient.MetadataKeyServed},
	} {
		if c.gateway != c.server || c.client != c.server {
			t.Errorf("%s: devgateway %q, eppclient %q, the picker (extproc) %q", c.what, c.gateway, c.client, c.server)
		}
	}
	for _, c := range []struct{ what, client, server string }{
		{"subset hint namespace", eppclient.MetadataNamespaceHint, extproc.MetadataNamespaceSubset},
		{"subset hint key", eppclient.MetadataKeySubset, extproc.MetadataKeySubset},
		{"conformance selection header", eppclient.HeaderTestSelection, extproc.HeaderConformanceSelection},
		{"conformance served header", eppclient.HeaderTestServedResult, extproc.HeaderConformanceServed},
	} {
		if c.client != c.server {
			t.Errorf("%s: eppclient %q, the picker (extproc) %q", c.what, c.client, c.server)
		}
	}
}
