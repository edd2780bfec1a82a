// Package wait is how muster's tests wait for a condition: polled, with a
// deadline, never a fixed sleep standing in for the condition.
package wait

import (
	"testing"
	"time"
)

// poll is how often For looks again.
const poll = 5 * time.Millisecond

// For polls cond until it holds, failing t (with what, "… not within …")
// if it still does not after within.
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(poll) // polling with a deadline
	}
}
