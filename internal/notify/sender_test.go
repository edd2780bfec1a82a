package notify_test

import (
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/testclock"
)

// TestAnotherReplicasAlarmIsNeitherSentNorResolved: an alarm Sends gives
// to another replica is not sent; one this replica sent and then handed
// over (its shard moved) is forgotten without a resolution, its queued
// retry dropped; taken back, it fires afresh; ended, it resolves once.
func TestAnotherReplicasAlarmIsNeitherSentNorResolved(t *testing.T) {
	t.Parallel()
	am := &flaky{}
	srv := httptest.NewServer(am)
	t.Cleanup(srv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "shard_unowned", Since: clock.Now(), Detail: "3 shards"})
	var mine atomic.Bool
	n, _ := newNotifier(t, clock, alarms, notify.Targets{Platform: &notify.Target{URL: srv.URL}}, func(c *notify.Config) {
		c.Sends = func(notify.Alarm) bool { return mine.Load() }
	})
	statuses := func() (firing, resolved int) {
		_, acc := am.state()
		for _, post := range acc {
			for _, a := range post {
				if a.EndsAt.After(clock.Now()) {
					firing++
				} else {
					resolved++
				}
			}
		}
		return firing, resolved
	}

	posts := func() int { p, _ := am.state(); return p }
	n.RunOnce(t.Context())
	if p := posts(); p != 0 {
		t.Fatalf("%d posts of an alarm another replica sends", p)
	}
	mine.Store(true)
	n.RunOnce(t.Context())
	if f, r := statuses(); f != 1 || r != 0 {
		t.Fatalf("this replica's alarm: %d firing, %d resolved; want 1, 0", f, r)
	}

	// Its resend fails, leaving a retry queued; then the shard moves.
	am.mu.Lock()
	am.fail = 1
	am.mu.Unlock()
	clock.Advance(time.Minute)
	n.RunOnce(t.Context())
	if p := posts(); p != 2 {
		t.Fatalf("%d posts, want the first and the failed resend", p)
	}
	mine.Store(false)
	for range 3 {
		clock.Advance(2 * time.Second)
		n.RunOnce(t.Context())
	}
	if p := posts(); p != 2 {
		t.Fatalf("after the handover: %d posts, want none more (no retry, no resolution)", p)
	}

	// Taken back: it fires afresh; ended: it resolves once.
	mine.Store(true)
	n.RunOnce(t.Context())
	if f, r := statuses(); f != 2 || r != 0 {
		t.Fatalf("taken back: %d firing, %d resolved; want 2, 0", f, r)
	}
	alarms.set()
	n.RunOnce(t.Context())
	if f, r := statuses(); f != 2 || r != 1 {
		t.Fatalf("ended: %d firing, %d resolved; want 2, 1", f, r)
	}
}
