// Package poll waits, in tests, for a state that nothing signals.
package poll

import (
	"testing"
	"time"
)

// Until calls cond every few milliseconds until it holds; once within has
// passed it fails t, naming what it waited for. Only for states no event
// tells of: where one does, a test waits on the event.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
