package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
)

type syncClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *syncClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *syncClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestRefusedEvidenceFloodIsRateBounded: a million refused items from
// three identities over five minutes become at most one audit row per
// identity per minute, the first within a tick of the first refusal, and
// every item is counted in some row.
func TestRefusedEvidenceFloodIsRateBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	clk := &syncClock{t: t0}
	sum, err := audit.NewRefusalSummaries(audit.RefusalSummariesConfig{Log: audit.NewLog(pool), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	actors := []string{"workload:a", "workload:b", "prober:p"}
	batch := make([]audit.RefusedItem, 1000)
	for i := range batch {
		code := []string{"not_granted", "not_own_instance", "not_assigned"}[i%3]
		batch[i] = audit.RefusedItem{Target: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Code: code, Class: "passive", Outcome: "failure", Reason: "r"}
	}
	const total = 1_000_000
	sent := 0
	// Five minutes, a RunOnce each simulated second, the flood spread
	// over it; identity a starts at once, b after 10 s, p after 70 s.
	for sec := 0; sec < 300; sec++ {
		for sent < total*(sec+1)/300 {
			a := actors[(sent/1000)%3]
			if (a == "workload:b" && sec < 10) || (a == "prober:p" && sec < 70) {
				a = "workload:a"
			}
			sum.Record("workload", a, batch)
			sent += len(batch)
		}
		if sec == 0 {
			// The first refusal is on the record within the tick.
			if failed := sum.RunOnce(ctx, false); failed != 0 {
				t.Fatalf("%d unwritten", failed)
			}
			evs, err := audit.List(ctx, db.New(pool), audit.Filter{Outcome: audit.Refused, Limit: 10})
			if err != nil || len(evs) != 1 || evs[0].Actor != "workload:a" {
				t.Fatalf("after the first second: %+v %v", evs, err)
			}
		}
		sum.RunOnce(ctx, false)
		clk.add(time.Second)
	}
	// The shutdown flush writes what is pending, due or not.
	shutdown := clk.now()
	sum.RunOnce(ctx, true)

	var evs []audit.Event
	for before := int64(0); ; {
		page, err := audit.List(ctx, db.New(pool), audit.Filter{Action: "evidence.report", BeforeSeq: before, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, page...)
		if len(page) < 100 {
			break
		}
		before = page[len(page)-1].Seq
	}
	counted := 0
	last := map[string]time.Time{}
	perActor := map[string]int{}
	for i := len(evs) - 1; i >= 0; i-- { // oldest first
		e := evs[i]
		if e.Outcome != audit.Refused {
			t.Fatalf("outcome %s", e.Outcome)
		}
		if prev, ok := last[e.Actor]; ok && e.At.Sub(prev) < time.Minute && !e.At.Equal(shutdown) {
			t.Errorf("%s: two summaries %s apart (%s, %s)", e.Actor, e.At.Sub(prev), prev, e.At)
		}
		last[e.Actor] = e.At
		perActor[e.Actor]++
		var after struct {
			RefusedTotal int            `json:"refused_total"`
			ByCode       map[string]int `json:"by_code"`
			First        []struct {
				InstanceID string `json:"instance_id"`
				Code       string `json:"code"`
			} `json:"first_refused"`
		}
		if err := json.Unmarshal(e.After, &after); err != nil {
			t.Fatal(err)
		}
		if len(after.First) != 10 || after.ByCode["not_granted"] == 0 {
			t.Errorf("summary %d: %s", e.Seq, e.After)
		}
		counted += after.RefusedTotal
	}
	if counted != total {
		t.Fatalf("summaries count %d refused items, want %d", counted, total)
	}
	// Five minutes: at most six rows an identity (one per minute, and the
	// shutdown flush); fewer for those that started later.
	if len(evs) > 3*6 || perActor["workload:a"] < 5 {
		t.Fatalf("%d summaries for a million refused items: %v", len(evs), perActor)
	}
	t.Logf("%d refused items -> %d audit rows %v", total, len(evs), perActor)
}

// TestRefusalSummaryWaitsOutTheDatabase: a summary that cannot be written
// is kept, merged with what comes after, and written once it can be.
func TestRefusalSummaryWaitsOutTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	clk := &syncClock{t: t0}
	flaky := &flakyLog{Log: audit.NewLog(pool), fail: true}
	sum, err := audit.NewRefusalSummaries(audit.RefusalSummariesConfig{Log: flaky, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	item := []audit.RefusedItem{{Target: "i", Code: "not_granted"}}
	sum.Record("workload", "workload:a", item)
	if n := sum.RunOnce(ctx, false); n != 1 {
		t.Fatalf("unwritten %d, want 1", n)
	}
	sum.Record("workload", "workload:a", item)
	flaky.fail = false
	clk.add(time.Second)
	if n := sum.RunOnce(ctx, false); n != 0 {
		t.Fatalf("unwritten %d", n)
	}
	evs, err := audit.List(ctx, db.New(pool), audit.Filter{Limit: 10})
	if err != nil || len(evs) != 1 {
		t.Fatalf("%+v %v", evs, err)
	}
	var after struct {
		RefusedTotal int `json:"refused_total"`
	}
	if err := json.Unmarshal(evs[0].After, &after); err != nil || after.RefusedTotal != 2 {
		t.Fatalf("merged summary: %s", evs[0].After)
	}
}

type flakyLog struct {
	*audit.Log
	fail bool
}

func (f *flakyLog) Append(ctx context.Context, now time.Time, e audit.Entry) (audit.Event, error) {
	if f.fail {
		return audit.Event{}, fmt.Errorf("database away")
	}
	return f.Log.Append(ctx, now, e)
}

// BenchmarkRefusalRecord is the hot path's cost of a refused batch of
// 1,000 items: a map update under a lock, no database.
func BenchmarkRefusalRecord(b *testing.B) {
	sum, err := audit.NewRefusalSummaries(audit.RefusalSummariesConfig{Log: &flakyLog{fail: true}})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]audit.RefusedItem, 1000)
	for i := range batch {
		batch[i] = audit.RefusedItem{Target: "t", Code: "not_granted"}
	}
	b.ReportAllocs()
	for b.Loop() {
		sum.Record("workload", "workload:a", batch)
	}
}
