package evaluator

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
)

// TestStatesAt reads, in one query, each instance's state at a time: the
// last transition before it (with its time and reason), else the first
// one's from-state after it; an instance without transitions is absent.
func TestStatesAt(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	t0 := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	recovered, fresh, quiet := uuid.New(), uuid.New(), uuid.New()
	rows := []db.TransitionsInsertParams{
		{InstanceID: recovered, Service: "web", FromState: "ineligible", ToState: "eligible", At: at(-50), Reason: "first success: entering rotation"},
		{InstanceID: recovered, Service: "web", FromState: "eligible", ToState: "ineligible", At: at(-40), Reason: "hard failure"},
		{InstanceID: recovered, Service: "web", FromState: "ineligible", ToState: "eligible", At: at(-30), Reason: "evidence healthy"},
		{InstanceID: recovered, Service: "web", FromState: "eligible", ToState: "ineligible", At: at(10), Reason: "hard failure"},
		{InstanceID: fresh, Service: "web", FromState: "ineligible", ToState: "eligible", At: at(5), Reason: "first success: entering rotation"},
	}
	if _, err := db.New(pool).TransitionsInsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	got, err := StatesAt(ctx, pool, []uuid.UUID{recovered, fresh, quiet}, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]StateAt{
		recovered: {State: "eligible", Before: true, At: at(-30), Reason: "evidence healthy"},
		fresh:     {State: "ineligible", At: at(5)},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(time.Time.Equal)); diff != "" {
		t.Errorf("states at %s (-want +got):\n%s", t0, diff)
	}
}
