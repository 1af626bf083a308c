// Command stamped prints the build identity; version_test builds it with
// -ldflags -X as `make image` builds poolpicker.
package main

import (
	"fmt"

	"github.com/poolpicker/poolpicker/internal/version"
)

func main() {
	i := version.Get()
	fmt.Print(i.Version, " ", i.Commit)
}
