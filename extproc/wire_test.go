// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package extproc

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// TestStructList: the subset hint as a list, a comma-joined string, or a
// list whose entries are comma-joined (as lwepp splits them).
func TestStructList(t *testing.T) {
	list := func(vs ...string) *structpb.Value {
		var l []*structpb.Value
		for _, v := range vs {
			l = append(l, structpb.NewStringValue(v))
		}
		return structpb.NewListValue(&structpb.ListValue{Values: l})
	}
	for _, tc := range []struct {
		name   string
		value  *structpb.Value
		want   []string
		wantOK bool
	}{
		{"list", list("10.0.0.1:8000", "10.0.0.2:8000"), []string{"10.0.0.1:8000", "10.0.0.2:8000"}, true},
		{"string", structpb.NewStringValue("10.0.0.1:8000, 10.0.0.2:8000"), []string{"10.0.0.1:8000", "10.0.0.2:8000"}, true},
		{"comma-joined entries", list("10.0.0.1:8000,10.0.0.2:8000", " 10.0.0.3:8000 ", ""), []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, true},
		{"number", structpb.NewNumberValue(3), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := structList(&structpb.Struct{Fields: map[string]*structpb.Value{MetadataKeySubset: tc.value}}, MetadataKeySubset)
			if ok != tc.wantOK || !slices.Equal(got, tc.want) {
				t.Fatalf("structList = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
