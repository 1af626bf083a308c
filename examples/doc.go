// Package examples checks that the examples under this directory, each a Go
// module of its own as an out-of-tree plugin would be, build and pass their
// tests against this tree.
package examples
