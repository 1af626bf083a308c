// Command etcd builds the upstream etcd server used by poolpicker's tests and
// local demo; it adds nothing of its own.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
