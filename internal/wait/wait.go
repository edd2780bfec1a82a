// Package wait is how muster's tests wait for a condition: polled, with a
// deadline, never a fixed sleep standing in for the condition.
package wait

import (
	"testing"
	"time"
)

// For looks again after 5 ms at first, then less and less often, every
// 100 ms at most: quick for what is nearly there, cheap for what takes
// minutes.
const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// For polls cond until it holds, failing t (with what, "… not within …")
// if it still does not after within.
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	poll := firstPoll
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(poll) // polling with a deadline
		poll = min(2*poll, maxPoll)
	}
}
