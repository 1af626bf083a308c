package v1_test

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func client_key(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }
