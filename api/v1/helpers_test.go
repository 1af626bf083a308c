// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package v1_test

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func client_key(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }
