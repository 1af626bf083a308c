//go:build race

package examples

// raceEnabled: the examples' tests run with the race detector when these do.
const raceEnabled = true
