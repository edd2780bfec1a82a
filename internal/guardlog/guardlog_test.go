package guardlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/guardlog"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestReplicasRecordOneEpisode: two replicas on one database report the
// same trip and clear at slightly different times; the log holds one
// episode, and a later trip is a second one.
func TestReplicasRecordOneEpisode(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	a, b := guardlog.New(pool, nil), guardlog.New(pool, nil)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	trip := func(at time.Time) guardlog.Event {
		return guardlog.Event{Service: "web", Zone: "az2", Tripped: true, At: at, Detail: "1 of 4 in rotation"}
	}
	clear := func(at time.Time) guardlog.Event { return guardlog.Event{Service: "web", Zone: "az2", At: at} }
	flush := func(l *guardlog.Log, evs ...guardlog.Event) {
		t.Helper()
		l.Record(evs)
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}

	flush(a, trip(t0))
	flush(b, trip(t0.Add(200*time.Millisecond))) // the same trip, seen a moment later
	flush(a, clear(t0.Add(time.Minute)))
	flush(b, clear(t0.Add(time.Minute+300*time.Millisecond)))
	// A slow replica that saw the trip only now, after the clear was
	// recorded: still the same episode.
	flush(b, trip(t0.Add(30*time.Second)))
	eps, err := a.List(ctx, "web", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || !eps[0].TrippedAt.Equal(t0) || eps[0].ClearedAt == nil || !eps[0].ClearedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("one episode from t0 to t0+1m expected, got %+v", eps)
	}

	// A new trip later is a new episode, open until cleared.
	flush(b, trip(t0.Add(5*time.Minute)))
	flush(a, trip(t0.Add(5*time.Minute+100*time.Millisecond)))
	eps, err = b.List(ctx, "web", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || !eps[0].TrippedAt.Equal(t0.Add(5*time.Minute)) || eps[0].ClearedAt != nil || eps[0].Detail != "1 of 4 in rotation" {
		t.Fatalf("a second, open episode expected first, got %+v", eps)
	}
	if other, err := a.List(ctx, "api", 10); err != nil || len(other) != 0 {
		t.Fatalf("another service's history: %+v %v", other, err)
	}
}

// TestFlushKeepsEventsOnFailure: events survive a failed write.
func TestFlushKeepsEventsOnFailure(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	l := guardlog.New(pool, nil)
	l.Record([]guardlog.Event{{Service: "web", Zone: "az1", Tripped: true, At: time.Now(), Detail: "d"}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Flush(ctx); err == nil {
		t.Fatal("flush with a cancelled context succeeded")
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	eps, err := l.List(context.Background(), "web", 10)
	if err != nil || len(eps) != 1 {
		t.Fatalf("the event kept after the failure was not written: %+v %v", eps, err)
	}
}
